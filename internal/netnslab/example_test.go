package netnslab_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
)

// A test with two nodes, a captured client pod and a server pod on the other node.
func ExampleNew() {
	var t testing.TB       // the test's *testing.T
	lab := netnslab.New(t) // skips unless root; removed at the end of the test
	n0, _ := lab.AddNode("node0")
	n1, _ := lab.AddNode("node1")
	client, _ := n0.AddPod("client")
	server, _ := n1.AddPod("server")
	_ = client.InstallCapture() // client's outbound TCP now lands on its own :15001

	ln, _ := server.Listen("tcp", ":8080") // a socket inside the server pod
	defer ln.Close()
	proxy, _ := client.Listen("tcp", ":15001") // where a ztunnel would listen
	defer proxy.Close()

	c, _ := client.Dial(context.Background(), "tcp", net.JoinHostPort(server.IP.String(), "8080"))
	defer c.Close()
	_, _ = io.WriteString(c, "hello") // accepted by proxy, SO_ORIGINAL_DST = server:8080

	// A daemon runs inside a node's namespace like any command.
	cmd := n0.Command(context.Background(), "ip", "route")
	fmt.Println(cmd.Args)
}
