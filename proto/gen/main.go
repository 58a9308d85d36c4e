// Command gen regenerates the Go code in api/ from the .proto files in proto/,
// without protoc: github.com/bufbuild/protocompile compiles the files (the
// well-known google/protobuf imports are built in), and protoc-gen-go, run
// from the module's pinned google.golang.org/protobuf with `go run`, turns the
// descriptors into Go through the ordinary plugin protocol. Nothing outside
// go.mod is needed, so `make generate` and CI's staleness check produce the
// same bytes on any machine.
//
// Run it with `go generate ./proto/gen` (or `make generate`). It is a tool:
// nothing imports it.
package main

//go:generate go run . -proto .. -root ../..

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/linker"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// module is the Go module the generated packages belong to; protoc-gen-go's
// module= option strips it from go_package to find each output directory.
const module = "github.com/ztunnel-go/ztunnel"

// plugin is protoc-gen-go at the version go.mod pins.
const plugin = "google.golang.org/protobuf/cmd/protoc-gen-go"

func main() {
	protoDir := flag.String("proto", "proto", "directory holding the .proto files")
	root := flag.String("root", ".", "module root; generated files are written below it")
	flag.Parse()
	if err := run(*protoDir, *root, *root); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// run compiles the protos in protoDir, runs the plugin from the module at
// moduleRoot, and writes the Go files below outRoot.
func run(protoDir, moduleRoot, outRoot string) error {
	names, err := filepath.Glob(filepath.Join(protoDir, "*.proto"))
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("no .proto files in %s", protoDir)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
	}
	slices.Sort(names)

	c := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{protoDir}}),
		SourceInfoMode: protocompile.SourceInfoStandard, // keeps comments for the generated doc comments
	}
	files, err := c.Compile(context.Background(), names...)
	if err != nil {
		return err
	}

	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: names,
		Parameter:      proto.String("module=" + module),
	}
	seen := map[string]bool{}
	for _, f := range files {
		addWithDeps(req, f, seen)
	}
	in, err := proto.Marshal(req)
	if err != nil {
		return err
	}

	cmd := exec.Command("go", "run", plugin)
	cmd.Dir = moduleRoot
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("running %s: %w", plugin, err)
	}
	resp := &pluginpb.CodeGeneratorResponse{}
	if err := proto.Unmarshal(out, resp); err != nil {
		return fmt.Errorf("decoding the plugin's response: %w", err)
	}
	if resp.Error != nil {
		return errors.New(resp.GetError())
	}
	return write(outRoot, resp.File)
}

// addWithDeps appends f's descriptor to req after those of its imports, the
// order the plugin protocol requires.
func addWithDeps(req *pluginpb.CodeGeneratorRequest, f protoreflect.FileDescriptor, seen map[string]bool) {
	if seen[f.Path()] {
		return
	}
	seen[f.Path()] = true
	imports := f.Imports()
	for i := range imports.Len() {
		addWithDeps(req, imports.Get(i).FileDescriptor, seen)
	}
	var fdp *descriptorpb.FileDescriptorProto
	if r, ok := f.(linker.Result); ok {
		fdp = r.FileDescriptorProto() // with source info, unlike protodesc's copy
	} else {
		fdp = protodesc.ToFileDescriptorProto(f)
	}
	req.ProtoFile = append(req.ProtoFile, fdp)
}

// write stores the generated files and removes .pb.go files they replace
// (a proto file renamed or deleted), so that the tree matches the protos.
func write(root string, files []*pluginpb.CodeGeneratorResponse_File) error {
	written := map[string]bool{}
	for _, f := range files {
		name := filepath.Clean(f.GetName())
		if f.InsertionPoint != nil || !strings.HasPrefix(name, "api"+string(filepath.Separator)) {
			return fmt.Errorf("unexpected output %q (insertion point %q)", f.GetName(), f.GetInsertionPoint())
		}
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, []byte(f.GetContent())) {
			if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
				return err
			}
		}
		written[path] = true
	}
	stale, err := filepath.Glob(filepath.Join(root, "api", "*", "*.pb.go"))
	if err != nil {
		return err
	}
	for _, p := range stale {
		if !written[p] {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	return nil
}
