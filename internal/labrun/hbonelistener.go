package labrun

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/hbone"
	"github.com/ztunnel-go/ztunnel/mtls"
)

// hboneListener is what the lab's HBONE apps (Waypoint, EWGateway) share:
// the accept loop, the mTLS handshake with one workload certificate
// (bounded to 10 s), an hbone.Server for the connections, and a record of
// every connection the app holds, so that close ends them all and waits for
// every goroutine the app started through it.
type hboneListener struct {
	ln     net.Listener
	srv    *hbone.Server
	cfg    *tls.Config
	ctx    context.Context // cancelled by close: ends ServeConn abruptly
	cancel context.CancelFunc
	// handshaken, if set, is called after each successful handshake.
	handshaken func()

	mu     sync.Mutex // guards the following fields
	open   map[net.Conn]struct{}
	closed bool

	wg sync.WaitGroup // the accept loop, connections and the app's goroutines
}

// start serves HBONE with cert on ln, passing CONNECTs to h, until close.
func (l *hboneListener) start(ln net.Listener, cert *mtls.WorkloadCert, h hbone.Handler, handshaken func()) {
	l.ln, l.handshaken = ln, handshaken
	l.open = map[net.Conn]struct{}{}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.cfg = mtls.ServerConfig(func() (*mtls.WorkloadCert, error) { return cert, nil })
	l.srv = hbone.NewServer(hbone.Config{}, h)
	l.wg.Go(l.accept)
}

func (l *hboneListener) accept() {
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			return
		}
		if !l.track(nc) {
			nc.Close()
			return
		}
		l.wg.Go(func() {
			defer l.untrack(nc)
			defer nc.Close()
			tc := tls.Server(nc, l.cfg)
			hctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
			err := tc.HandshakeContext(hctx)
			cancel()
			if err != nil {
				return
			}
			if l.handshaken != nil {
				l.handshaken()
			}
			_ = l.srv.ServeConn(l.ctx, tc) // owns tc and closes it
		})
	}
}

// track records c so that close ends it; false once closing, when the
// caller must close c itself.
func (l *hboneListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.open[c] = struct{}{}
	return true
}

func (l *hboneListener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.open, c)
	l.mu.Unlock()
}

// close stops accepting, ends every connection and stream and waits for
// the goroutines.
func (l *hboneListener) close() error {
	err := l.ln.Close()
	l.cancel()
	l.mu.Lock()
	l.closed = true
	for c := range l.open {
		c.Close()
	}
	l.mu.Unlock()
	_ = l.srv.Close()
	l.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
