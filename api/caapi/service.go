package caapi

import (
	"context"

	"google.golang.org/grpc"
)

// CreateCertificateMethod is the full gRPC method name of
// IstioCertificateService.CreateCertificate.
const CreateCertificateMethod = "/istio.v1.auth.IstioCertificateService/CreateCertificate"

// IstioCertificateServiceClient calls the Istio CA.
type IstioCertificateServiceClient interface {
	// CreateCertificate asks the CA to sign in.Csr.
	CreateCertificate(ctx context.Context, in *IstioCertificateRequest, opts ...grpc.CallOption) (*IstioCertificateResponse, error)
}

type certificateClient struct{ cc grpc.ClientConnInterface }

// NewIstioCertificateServiceClient returns a client that calls the CA over cc.
func NewIstioCertificateServiceClient(cc grpc.ClientConnInterface) IstioCertificateServiceClient {
	return certificateClient{cc}
}

func (c certificateClient) CreateCertificate(ctx context.Context, in *IstioCertificateRequest, opts ...grpc.CallOption) (*IstioCertificateResponse, error) {
	out := new(IstioCertificateResponse)
	if err := c.cc.Invoke(ctx, CreateCertificateMethod, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// IstioCertificateServiceServer is what a CA implements.
type IstioCertificateServiceServer interface {
	// CreateCertificate signs a CSR. Errors should be gRPC status errors.
	CreateCertificate(context.Context, *IstioCertificateRequest) (*IstioCertificateResponse, error)
}

// RegisterIstioCertificateServiceServer registers srv on s.
func RegisterIstioCertificateServiceServer(s grpc.ServiceRegistrar, srv IstioCertificateServiceServer) {
	s.RegisterService(&IstioCertificateServiceDesc, srv)
}

// IstioCertificateServiceDesc describes the service for grpc.Server.
var IstioCertificateServiceDesc = grpc.ServiceDesc{
	ServiceName: "istio.v1.auth.IstioCertificateService",
	HandlerType: (*IstioCertificateServiceServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "CreateCertificate",
		Handler:    createCertificateHandler,
	}},
	Metadata: "citadel.proto",
}

func createCertificateHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(IstioCertificateRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(IstioCertificateServiceServer).CreateCertificate(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: CreateCertificateMethod}
	handler := func(ctx context.Context, req any) (any, error) {
		return srv.(IstioCertificateServiceServer).CreateCertificate(ctx, req.(*IstioCertificateRequest))
	}
	return interceptor(ctx, in, info, handler)
}
