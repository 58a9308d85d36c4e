package splice

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DefaultPipeSize is the pipe capacity the pool asks for when its Config
// names none. Larger pipes mean fewer splice calls per byte; a pooled pipe
// costs only its slot array while empty, and the data pages while full.
const DefaultPipeSize = 1 << 20

// flags for every splice: never block (the loop owns the thread), and move
// pages rather than copy them where the kernel can.
const flags = unix.SPLICE_F_NONBLOCK | unix.SPLICE_F_MOVE

// Pipe is a kernel pipe used as the in-flight buffer of one relay direction.
type Pipe struct {
	// R and W are the read and write ends (non-blocking, close-on-exec).
	R, W int
	// Size is the pipe's capacity in bytes.
	Size int
	// Buffered counts bytes spliced in and not yet spliced out. The user of
	// the pipe keeps it current; Pool.Put checks it.
	Buffered int

	pooled bool // in a Pool's free list (checked with -tags assert)
}

// NewPipe creates a pipe and asks the kernel for size bytes of capacity
// (0 means DefaultPipeSize). If the kernel grants less (the
// fs.pipe-max-size limit, or the per-user pipe page limit), the pipe keeps
// what it was given.
func NewPipe(size int) (*Pipe, error) {
	if size <= 0 {
		size = DefaultPipeSize
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("splice: pipe2: %w", err)
	}
	p := &Pipe{R: fds[0], W: fds[1]}
	got, err := unix.FcntlInt(uintptr(p.W), unix.F_SETPIPE_SZ, size)
	if err != nil {
		got, err = unix.FcntlInt(uintptr(p.W), unix.F_GETPIPE_SZ, 0)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("splice: F_GETPIPE_SZ: %w", err)
		}
	}
	p.Size = got
	return p, nil
}

// Slots is how many buffers the pipe has room for: one per page of its
// capacity. A splice from a socket takes one per page fragment, so a pipe
// can run out of slots before it runs out of bytes.
func (p *Pipe) Slots() int { return p.Size / pageSize }

var pageSize = os.Getpagesize()

// Close closes both ends.
func (p *Pipe) Close() error {
	return errors.Join(unix.Close(p.R), unix.Close(p.W))
}

// In splices up to max bytes from socket fd into the pipe (bounded by the
// pipe's free room) and returns how many moved. (0, nil) means end of
// stream; unix.EAGAIN means fd has nothing to read or the pipe is full.
func (p *Pipe) In(fd, max int) (int, error) {
	if room := p.Size - p.Buffered; max > room {
		max = room
	}
	if max <= 0 {
		return 0, unix.EAGAIN
	}
	for {
		n, err := unix.Splice(fd, nil, p.W, nil, max, flags)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		p.Buffered += int(n)
		return int(n), nil
	}
}

// Park copies b into the pipe behind what it already holds, for bytes that
// were read into memory but that their destination did not take: Out then
// sends them like spliced ones. unix.EAGAIN means the pipe lacks the room
// (its bytes, or its slots: a write fills whole pages, so an empty pipe
// always has room for its Size); on an error the bytes written before it
// stay counted in Buffered.
func (p *Pipe) Park(b []byte) error {
	if len(b) > p.Size-p.Buffered {
		return unix.EAGAIN
	}
	for len(b) > 0 {
		n, err := unix.Write(p.W, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		p.Buffered += n
		b = b[n:]
	}
	return nil
}

// Out splices buffered bytes from the pipe to socket fd and returns how many
// moved; unix.EAGAIN means fd's send buffer is full.
func (p *Pipe) Out(fd int) (int, error) {
	if p.Buffered == 0 {
		return 0, nil
	}
	for {
		n, err := unix.Splice(p.R, nil, fd, nil, p.Buffered, flags)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		p.Buffered -= int(n)
		return int(n), nil
	}
}

// Pool keeps empty pipes for reuse by one goroutine.
type Pool struct {
	size  int
	max   int
	free  []*Pipe
	inUse int
}

// PoolConfig configures a Pool. The zero value is usable.
type PoolConfig struct {
	// PipeSize is each pipe's requested capacity; 0 means DefaultPipeSize.
	PipeSize int
	// MaxFree bounds the empty pipes kept for reuse; more are closed on Put.
	// 0 means 64; negative keeps none.
	MaxFree int
}

// NewPool returns an empty pool.
func NewPool(cfg PoolConfig) *Pool {
	if cfg.MaxFree == 0 {
		cfg.MaxFree = 64
	}
	if cfg.MaxFree < 0 {
		cfg.MaxFree = 0
	}
	return &Pool{size: cfg.PipeSize, max: cfg.MaxFree}
}

// Get returns an empty pipe, reusing a pooled one when there is one.
func (p *Pool) Get() (*Pipe, error) {
	if n := len(p.free); n > 0 {
		pp := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		pp.pooled = false
		p.inUse++
		return pp, nil
	}
	pp, err := NewPipe(p.size)
	if err != nil {
		return nil, err
	}
	p.inUse++
	return pp, nil
}

// Put returns a pipe taken from Get. An empty pipe is kept for reuse (up to
// MaxFree); a pipe that still holds bytes is closed, since nothing can tell
// its stale contents from the next user's.
func (p *Pool) Put(pp *Pipe) {
	if assertions && (pp.pooled || pp.Buffered < 0 || p.inUse <= 0) {
		panic("splice: pipe put back twice, or its byte count went negative")
	}
	p.inUse--
	if pp.Buffered != 0 || len(p.free) >= p.max {
		pp.Close()
		return
	}
	pp.pooled = true
	p.free = append(p.free, pp)
}

// InUse reports how many pipes are out of the pool.
func (p *Pool) InUse() int { return p.inUse }

// Free reports how many empty pipes the pool keeps.
func (p *Pool) Free() int { return len(p.free) }

// Close closes the pooled pipes. Pipes in use are their holders' to Put.
func (p *Pool) Close() {
	for _, pp := range p.free {
		pp.Close()
	}
	p.free = nil
}
