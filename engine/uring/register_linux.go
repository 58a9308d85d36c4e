package uring

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	registerEventfd        = 4
	unregisterEventfd      = 5
	registerProbe          = 8
	registerEnableRings    = 12
	registerPbufRing       = 22
	unregisterPbufRing     = 23
	probeOpSupported       = 1
	probeOps               = 256
	probeHeaderSize        = 16
	probeOpSize            = 8
	pbufRingTailOffset     = 14
	provideBufferEntrySize = 16
)

func (r *Ring) register(op uint32, arg unsafe.Pointer, n uint32) error {
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uintptr(op), uintptr(arg), uintptr(n), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// Probe lists the operations the running kernel supports.
type Probe struct {
	lastOp uint8
	ops    [probeOps]bool
}

// Supported reports whether the kernel knows opcode op.
func (p *Probe) Supported(op uint8) bool { return p.ops[op] }

// Probe asks the kernel which operations it supports.
func (r *Ring) Probe() (*Probe, error) {
	buf := make([]byte, probeHeaderSize+probeOps*probeOpSize)
	if err := r.register(registerProbe, unsafe.Pointer(&buf[0]), probeOps); err != nil {
		return nil, fmt.Errorf("uring: probe: %w", err)
	}
	p := &Probe{lastOp: buf[0]}
	n := int(buf[1])
	for i := range n {
		op := buf[probeHeaderSize+i*probeOpSize]
		flags := *(*uint16)(unsafe.Pointer(&buf[probeHeaderSize+i*probeOpSize+2]))
		if flags&probeOpSupported != 0 {
			p.ops[op] = true
		}
	}
	return p, nil
}

// RegisterEventfd makes the kernel signal efd on every completion, so a
// ring can be watched from an epoll set or another thread.
func (r *Ring) RegisterEventfd(efd int) error {
	v := int32(efd)
	if err := r.register(registerEventfd, unsafe.Pointer(&v), 1); err != nil {
		return fmt.Errorf("uring: register eventfd: %w", err)
	}
	return nil
}

// UnregisterEventfd undoes RegisterEventfd.
func (r *Ring) UnregisterEventfd() error {
	if err := r.register(unregisterEventfd, nil, 0); err != nil {
		return fmt.Errorf("uring: unregister eventfd: %w", err)
	}
	return nil
}

// Enable starts a ring created with SetupRDisabled; with SetupSingleIssuer
// the calling thread becomes the only one allowed to submit.
func (r *Ring) Enable() error {
	if err := r.register(registerEnableRings, nil, 0); err != nil {
		return fmt.Errorf("uring: enable ring: %w", err)
	}
	return nil
}

// BufRing is a provided-buffer ring: buffers the kernel picks from for
// recv with SQEBufferSelect, handed back by the owner once consumed.
type BufRing struct {
	r       *Ring
	group   uint16
	mem     []byte // the ring of struct io_uring_buf, page aligned
	bufs    [][]byte
	mask    uint16
	tail    uint16
	tailPtr *uint16
}

// RegisterBufRing registers a ring of n buffers of size bytes (n a power of
// two) as provided-buffer group.
func (r *Ring) RegisterBufRing(group uint16, n int, size int) (*BufRing, error) {
	if n <= 0 || n&(n-1) != 0 || n > 1<<15 {
		return nil, fmt.Errorf("uring: buffer ring of %d entries: want a power of two up to 32768", n)
	}
	mem, err := unix.Mmap(-1, 0, n*provideBufferEntrySize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANONYMOUS|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("uring: buffer ring memory: %w", err)
	}
	reg := struct {
		RingAddr    uint64
		RingEntries uint32
		Bgid        uint16
		Flags       uint16
		Resv        [3]uint64
	}{RingAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), RingEntries: uint32(n), Bgid: group}
	if err := r.register(registerPbufRing, unsafe.Pointer(&reg), 1); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("uring: register buffer ring: %w", err)
	}
	br := &BufRing{r: r, group: group, mem: mem, mask: uint16(n - 1), tailPtr: (*uint16)(unsafe.Pointer(&mem[pbufRingTailOffset]))}
	for i := range n {
		b := make([]byte, size)
		br.bufs = append(br.bufs, b)
		br.add(uint16(i))
	}
	br.publish()
	return br, nil
}

// Group returns the ring's buffer group id, for PrepRecvBufferSelect.
func (br *BufRing) Group() uint16 { return br.group }

// Buffer returns buffer id's memory.
func (br *BufRing) Buffer(id uint16) []byte { return br.bufs[id] }

func (br *BufRing) add(id uint16) {
	e := unsafe.Pointer(&br.mem[int(br.tail&br.mask)*provideBufferEntrySize])
	*(*uint64)(e) = uint64(uintptr(unsafe.Pointer(&br.bufs[id][0])))
	*(*uint32)(unsafe.Add(e, 8)) = uint32(len(br.bufs[id]))
	*(*uint16)(unsafe.Add(e, 12)) = id
	br.tail++
}

func (br *BufRing) publish() {
	// release: the entries are written before the kernel sees the tail.
	atomicStoreUint16(br.tailPtr, br.tail)
}

// Recycle hands buffer id back to the kernel once its data is consumed.
func (br *BufRing) Recycle(id uint16) {
	br.add(id)
	br.publish()
}

// Close unregisters the group and frees the ring.
func (br *BufRing) Close() error {
	reg := struct {
		RingAddr    uint64
		RingEntries uint32
		Bgid        uint16
		Flags       uint16
		Resv        [3]uint64
	}{Bgid: br.group}
	err := br.r.register(unregisterPbufRing, unsafe.Pointer(&reg), 1)
	unix.Munmap(br.mem)
	if err != nil {
		return fmt.Errorf("uring: unregister buffer ring: %w", err)
	}
	return nil
}

// atomicStoreUint16 is a release store of a 16-bit value (little-endian
// layout, as on every platform the daemon ships for). sync/atomic has
// no 16-bit operations; the tail shares an aligned 32-bit word with the
// reserved field of entry 0's other half, which nobody else writes, so a
// 32-bit store of the whole word is equivalent.
func atomicStoreUint16(p *uint16, v uint16) {
	word := (*uint32)(unsafe.Pointer(uintptr(unsafe.Pointer(p)) &^ 3))
	shift := (uintptr(unsafe.Pointer(p)) & 3) * 8
	old := atomic.LoadUint32(word)
	atomic.StoreUint32(word, old&^(0xffff<<shift)|uint32(v)<<shift)
}
