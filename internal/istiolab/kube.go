package istiolab

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// adminUser is the name the static token file gives the lab's operator.
const adminUser = "istiolab-admin"

// kubeconfig renders a kubeconfig for server, trusting caPEM, as user with a
// bearer token: what kubectl and istiod read.
func kubeconfig(server string, caPEM []byte, user, token string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: istiolab
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: istiolab
  context:
    cluster: istiolab
    user: %s
current-context: istiolab
`, server, base64.StdEncoding.EncodeToString(caPEM), user, token, user)
}

// kubeconfigTokenFile is kubeconfig with the user's token read from a file,
// which client-go reads again as it changes: what a pod's in-cluster
// configuration does with its projected token.
func kubeconfigTokenFile(server string, caPEM []byte, user, tokenPath string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: istiolab
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    tokenFile: %s
contexts:
- name: istiolab
  context:
    cluster: istiolab
    user: %s
current-context: istiolab
`, server, base64.StdEncoding.EncodeToString(caPEM), user, tokenPath, user)
}

// apiClient talks to the API server from the host's test process: it dials
// through the lab node's namespace (the host has no route into the lab) and
// trusts only the lab's CA. It does the few calls a kubeconfig-less caller
// needs (readiness, TokenRequest); everything else goes through kubectl.
type apiClient struct {
	server string // https://IP:port
	token  string
	http   *http.Client
}

func newAPIClient(node netnslab.NS, server string, caPEM []byte, token string) *apiClient {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &apiClient{server: server, token: token, http: &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return node.Dial(ctx, network, addr)
			},
			TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2: true,
		},
	}}
}

// apiError is a non-2xx answer of the API server.
type apiError struct {
	Method, Path string
	Code         int
	Body         string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("istiolab: %s %s: status %d: %s", e.Method, e.Path, e.Code, e.Body)
}

// do sends a request with body as JSON (nil: none) and decodes a 2xx answer
// into out (nil: discarded).
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	return c.doAs(ctx, method, path, "application/json", body, out)
}

// mergePatch applies patch to the object at path as a JSON merge patch.
func (c *apiClient) mergePatch(ctx context.Context, path string, patch any) error {
	return c.doAs(ctx, http.MethodPatch, path, "application/merge-patch+json", patch, nil)
}

// doAs is do with the body's content type.
func (c *apiClient) doAs(ctx context.Context, method, path, contentType string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("istiolab: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("istiolab: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return &apiError{Method: method, Path: path, Code: resp.StatusCode, Body: strings.TrimSpace(string(data))}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("istiolab: %s %s: %w", method, path, err)
	}
	return nil
}

// ready asks /readyz; nil means every check passed.
func (c *apiClient) ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil, nil)
}

// tokenRequest is authentication.k8s.io/v1 TokenRequest, the fields used.
type tokenRequest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Audiences         []string        `json:"audiences"`
		ExpirationSeconds int64           `json:"expirationSeconds,omitempty"`
		BoundObjectRef    *boundObjectRef `json:"boundObjectRef,omitempty"`
	} `json:"spec"`
	Status struct {
		Token string `json:"token"`
	} `json:"status"`
}

// boundObjectRef ties a token to an object (a Pod): the token is valid only
// while that object exists, and TokenReview names it (the pod's name and
// UID), which istiod's node authorizer reads.
type boundObjectRef struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
}

// serviceAccountToken asks the TokenRequest API for a token of service
// account namespace/name with the given audiences, bound to bound if not
// nil, as the kubelet does for a pod's projected token volume.
func (c *apiClient) serviceAccountToken(ctx context.Context, namespace, name string, audiences []string, ttl time.Duration, bound *boundObjectRef) (string, error) {
	var tr tokenRequest
	tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenRequest"
	tr.Spec.Audiences = audiences
	tr.Spec.ExpirationSeconds = int64(ttl / time.Second)
	tr.Spec.BoundObjectRef = bound
	path := fmt.Sprintf("/api/v1/namespaces/%s/serviceaccounts/%s/token", namespace, name)
	if err := c.do(ctx, http.MethodPost, path, &tr, &tr); err != nil {
		return "", err
	}
	if tr.Status.Token == "" {
		return "", errors.New("istiolab: TokenRequest answered no token")
	}
	return tr.Status.Token, nil
}

// kubectl runs the lab's kubectl in ns with the kubeconfig at
// kubeconfigPath and home as its HOME (its discovery cache), stdin as its
// input (empty: none), and returns its standard output; a failure carries
// its standard error.
func kubectl(ctx context.Context, ns netnslab.NS, bin, kubeconfigPath, home, stdin string, args ...string) ([]byte, error) {
	cmd := ns.Command(ctx, bin, append([]string{"--kubeconfig", kubeconfigPath}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("istiolab: kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
