package record

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/fuzzseed"
)

// newRand is the tests' seeded PRNG.
func newRand(seed uint64) *mrand.Rand { return mrand.New(mrand.NewPCG(seed, 0x5eed)) }

// readOutcome is how a read side ended on a stream: everything it returned,
// the class of its final error, and the state it was left in.
type readOutcome struct {
	data      []byte
	err       string
	alert     uint32 // pendingAlert
	keyUpdate bool   // pendingKeyUpdate
	secret    []byte // the read secret
}

func (o readOutcome) String() string {
	return fmt.Sprintf("%d bytes, %s, alert owed %d, KeyUpdate owed %v", len(o.data), o.err, o.alert, o.keyUpdate)
}

// equal reports whether two outcomes are the same.
func (o readOutcome) equal(p readOutcome) bool {
	return bytes.Equal(o.data, p.data) && o.err == p.err && o.alert == p.alert &&
		o.keyUpdate == p.keyUpdate && bytes.Equal(o.secret, p.secret)
}

// errClass names what a read error means, not its text.
func errClass(err error) string {
	var pe *ProtocolError
	var ae AlertError
	switch {
	case errors.As(err, &pe):
		return "protocol error with " + alert(pe.Alert).String()
	case errors.As(err, &ae):
		return "peer's alert " + alert(ae).String()
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected EOF"
	case errors.Is(err, io.EOF):
		return "EOF"
	}
	return "other error: " + err.Error()
}

func outcomeOf(r *Conn, data []byte, err error) readOutcome {
	in, _ := secrets(r)
	return readOutcome{data: data, err: errClass(err), alert: r.pendingAlert.Load(),
		keyUpdate: r.pendingKeyUpdate.Load(), secret: in}
}

// blockingOutcome reads stream with Read, the socket cut into chunks as
// in FuzzRead, with a p of readSize bytes.
func blockingOutcome(t testing.TB, id uint16, stream, chunks []byte, readSize int) readOutcome {
	t.Helper()
	r := established(t, &streamConn{r: bytes.NewReader(stream), chunks: chunks}, id, true)
	p := make([]byte, readSize)
	var data []byte
	for range len(stream) + 3 {
		n, err := r.Read(p)
		data = append(data, p[:n]...)
		if err != nil {
			return outcomeOf(r, data, err)
		}
	}
	t.Fatal("Reads did not end")
	return readOutcome{}
}

// fdOutcome reads stream with TryRead in fd mode over a non-blocking unix
// socketpair. rng cuts the stream into the writes that put it on the
// socket, picks how many TryReads run between writes (so that they meet an
// empty socket, ErrWouldBlock, at random points, and find several writes
// coalesced at others) and the size of each TryRead's p.
func fdOutcome(t testing.TB, id uint16, stream []byte, rng *mrand.Rand) readOutcome {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	r := established(t, &streamConn{r: bytes.NewReader(nil)}, id, true)
	if err := r.UseFD(fds[0]); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := make([]byte, 2*maxPlaintext)
	var data []byte
	var end error
	// read runs up to max TryReads; it reports whether the stream ended.
	read := func(max int) bool {
		for range max {
			var size int
			switch rng.IntN(3) {
			case 0:
				size = 1 + rng.IntN(16)
			case 1:
				size = 1 + rng.IntN(2000)
			default:
				size = maxPlaintext + rng.IntN(maxPlaintext)
			}
			n, err := r.TryRead(p[:size])
			data = append(data, p[:n]...)
			if err == ErrWouldBlock {
				return false
			}
			if err != nil {
				end = err
				return true
			}
		}
		return false
	}
	splits := []int{10, 3000, 70000}[rng.IntN(3)]
	for rest := stream; len(rest) > 0; {
		n, err := unix.Write(fds[1], rest[:1+rng.IntN(min(len(rest), splits))])
		switch {
		case err == unix.EAGAIN:
			n = 0
		case err != nil:
			t.Fatal(err)
		}
		rest = rest[n:]
		reads := rng.IntN(4)
		if n == 0 {
			reads++ // the socket is full: make room
		}
		if read(reads) {
			return outcomeOf(r, data, end)
		}
	}
	if err := unix.Shutdown(fds[1], unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	for range len(stream) + 3 {
		if read(1) {
			return outcomeOf(r, data, end)
		}
	}
	t.Fatal("TryReads did not end")
	return readOutcome{}
}

// genStream makes a random stream of records a server sends: data of
// every size, padding, empty records (in runs that sometimes pass the
// bound), KeyUpdates (moving w's keys as the real writer does), tickets
// whole and split, user_canceled; then one ending, clean or not.
func genStream(t testing.TB, w *Conn, rng *mrand.Rand) []byte {
	var out []byte
	add := func(typ byte, content []byte) { out = append(out, sealed(t, w, typ, content)...) }
	payload := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	for range 1 + rng.IntN(40) {
		switch rng.IntN(12) {
		case 0, 1, 2:
			add(typeApplicationData, payload(1+rng.IntN(200)))
		case 3, 4:
			add(typeApplicationData, payload(1+rng.IntN(maxPlaintext)))
		case 5:
			add(typeApplicationData, nil)
		case 6:
			content := payload(1 + rng.IntN(1000))
			out = append(out, sealedInner(t, w, padded(content, typeApplicationData, len(content)+1+rng.IntN(300)))...)
		case 7:
			add(typeHandshake, keyUpdateMsg(byte(rng.IntN(2))))
			w.wmu.Lock()
			err := w.out.update()
			w.wmu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		case 8:
			add(typeHandshake, []byte{hsNewSessionTicket, 0, 0, 3, 1, 2, 3})
		case 9:
			add(typeHandshake, []byte{hsNewSessionTicket, 0, 0, 4, 1})
			add(typeHandshake, []byte{2, 3, 4})
		case 10:
			add(typeAlert, []byte{1, byte(alertUserCanceled)})
		case 11:
			for range 1 + rng.IntN(maxIdleRecords+8) {
				add(typeApplicationData, nil)
			}
		}
	}
	switch rng.IntN(8) {
	case 0:
		add(typeAlert, []byte{1, 0})
	case 1:
		add(typeAlert, []byte{2, byte(alertInternalError)})
	case 2:
		b := sealed(t, w, typeApplicationData, payload(50))
		b[headerLen+rng.IntN(50)] ^= 1
		out = append(out, b...)
	case 3:
		b := sealed(t, w, typeApplicationData, payload(100))
		out = append(out, b[:1+rng.IntN(len(b)-1)]...)
	case 4:
		// The stream ends at a record boundary, without close_notify.
	case 5:
		out = append(out, typeApplicationData, 3, 3, 0x41, 0x01)
	case 6:
		add(typeApplicationData, payload(maxPlaintext+1))
	case 7:
		add(typeAlert, []byte{1, 0})
		add(typeApplicationData, []byte("after the end"))
	}
	return out
}

// TestTryReadMatchesRead: on random streams (seeded) cut at random points,
// TryRead in fd mode, meeting an empty socket at random points and reading
// into p of random sizes, ends exactly as Read does: the same bytes, the
// same error class, the same alert and KeyUpdate owed, the same read keys.
func TestTryReadMatchesRead(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	var ended = map[string]int{}
	for seed := range uint64(seeds) {
		rng := newRand(seed)
		id := tls.TLS_AES_128_GCM_SHA256
		if rng.IntN(2) == 0 {
			id = tls.TLS_AES_256_GCM_SHA384
		}
		w := established(t, &streamConn{r: bytes.NewReader(nil)}, id, false)
		stream := genStream(t, w, rng)
		chunks := make([]byte, rng.IntN(5))
		for i := range chunks {
			chunks[i] = byte(rng.Uint32())
		}
		want := blockingOutcome(t, id, stream, chunks, 1+rng.IntN(2*maxPlaintext))
		got := fdOutcome(t, id, stream, rng)
		if !got.equal(want) {
			t.Fatalf("seed %d: TryRead: %v; Read: %v", seed, got, want)
		}
		ended[want.err]++
	}
	// The generator must reach the endings that matter, or the equality
	// above proves little.
	for _, e := range []string{"EOF", "unexpected EOF", "protocol error with bad_record_mac",
		"protocol error with record_overflow", "protocol error with unexpected_message", "peer's alert internal_error"} {
		if ended[e] == 0 {
			t.Errorf("no stream ended with %s: %v", e, ended)
		}
	}
}

// FuzzTryRead is FuzzRead's script read both ways, Read and TryRead in fd
// mode (seed picks the socket splits, the ErrWouldBlock points and the read
// sizes): the outcomes must be equal. Its seeds are FuzzRead's corpus.
func FuzzTryRead(f *testing.F) {
	seeds, err := readCorpus(filepath.Join("testdata", "fuzz", "FuzzRead"))
	if err != nil {
		f.Fatal(err)
	}
	if len(seeds) == 0 {
		f.Fatal("FuzzRead's corpus is empty")
	}
	for i, s := range seeds {
		fuzzseed.Add(f, append(s, uint64(i))...)
	}
	f.Fuzz(func(t *testing.T, script, chunks []byte, readSize uint16, aes256 bool, seed uint64) {
		id := tls.TLS_AES_128_GCM_SHA256
		if aes256 {
			id = tls.TLS_AES_256_GCM_SHA384
		}
		w := established(t, &streamConn{r: bytes.NewReader(nil)}, id, false)
		stream := fuzzStream(t, w, script)
		want := blockingOutcome(t, id, stream, chunks, int(readSize)+1)
		got := fdOutcome(t, id, stream, newRand(seed))
		if !got.equal(want) {
			t.Fatalf("TryRead: %v; Read: %v", got, want)
		}
	})
}

// readCorpus reads the corpus files ("go test fuzz v1") in dir: the
// values of the types FuzzRead takes.
func readCorpus(dir string) ([][]any, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out [][]any
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		vals, err := parseCorpusFile(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, vals)
	}
	return out, nil
}

func parseCorpusFile(s string) ([]any, error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) == 0 || lines[0] != "go test fuzz v1" {
		return nil, errors.New("not a corpus file")
	}
	var vals []any
	for _, l := range lines[1:] {
		open := strings.IndexByte(l, '(')
		if open < 0 || !strings.HasSuffix(l, ")") {
			return nil, fmt.Errorf("line %q", l)
		}
		typ, lit := l[:open], l[open+1:len(l)-1]
		switch typ {
		case "[]byte":
			v, err := strconv.Unquote(lit)
			if err != nil {
				return nil, fmt.Errorf("line %q: %w", l, err)
			}
			vals = append(vals, []byte(v))
		case "uint16":
			v, err := strconv.ParseUint(lit, 0, 16)
			if err != nil {
				return nil, fmt.Errorf("line %q: %w", l, err)
			}
			vals = append(vals, uint16(v))
		case "bool":
			v, err := strconv.ParseBool(lit)
			if err != nil {
				return nil, fmt.Errorf("line %q: %w", l, err)
			}
			vals = append(vals, v)
		default:
			return nil, fmt.Errorf("type %q", typ)
		}
	}
	return vals, nil
}
