package record

import (
	"io"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// fdBenchSizes are the op sizes of the fd-mode benchmarks: one byte (a
// request/response round trip's cost per record) and one full record.
var fdBenchSizes = []int{1, maxPlaintext}

// fdBenchName names a sub-benchmark: the path and the op size.
func fdBenchName(fd bool, size int) string {
	mode := "blocking"
	if fd {
		mode = "fd"
	}
	return mode + "/" + strconv.Itoa(size) + "B"
}

// BenchmarkFDRead reads one record of each size per op, with TryRead in
// fd mode (waiting in poll(2) on an empty socket) and with the blocking
// Read, from a peer that writes such records back to back, as fast as it
// can, in batches of about 16 KiB.
func BenchmarkFDRead(b *testing.B) {
	for _, fd := range []bool{true, false} {
		for _, size := range fdBenchSizes {
			b.Run(fdBenchName(fd, size), func(b *testing.B) {
				cli, srv := pair(b, kindOurs, kindOurs, nil)
				r, w := cli.(*Conn), srv.(*Conn)
				rfd := -1
				if fd {
					rfd = detachFD(b, r)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					content := make([]byte, size)
					var batch []byte
					for {
						batch = batch[:0]
						w.wmu.Lock()
						for len(batch) < maxPlaintext {
							var err error
							if batch, err = w.appendRecordLocked(batch, typeApplicationData, content); err != nil {
								w.wmu.Unlock()
								return
							}
						}
						w.wmu.Unlock()
						if _, err := w.raw.Write(batch); err != nil {
							return
						}
					}
				}()
				p := make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if !fd {
						if _, err := io.ReadFull(r, p); err != nil {
							b.Fatal(err)
						}
						continue
					}
					for got := 0; got < size; {
						n, err := r.TryRead(p[got:])
						got += n
						if err == ErrWouldBlock {
							waitFD(b, rfd, unix.POLLIN)
						} else if err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				w.raw.Close() // ends the writer
				<-done
			})
		}
	}
}

// BenchmarkFDWrite writes one op of each size, with TryWrite in fd mode
// (waiting in poll(2) and flushing with TryFlush when refused) and with the
// blocking Write, to a peer that discards the raw bytes.
func BenchmarkFDWrite(b *testing.B) {
	for _, fd := range []bool{true, false} {
		for _, size := range fdBenchSizes {
			b.Run(fdBenchName(fd, size), func(b *testing.B) {
				cli, srv := pair(b, kindOurs, kindOurs, nil)
				c, peer := cli.(*Conn), srv.(*Conn)
				wfd := -1
				if fd {
					wfd = detachFD(b, c)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					_, _ = io.Copy(io.Discard, peer.raw)
				}()
				p := make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if !fd {
						if _, err := c.Write(p); err != nil {
							b.Fatal(err)
						}
						continue
					}
					for {
						ok, queued, err := c.TryWrite(p)
						if err != nil {
							b.Fatal(err)
						}
						if ok {
							break
						}
						if !queued {
							b.Fatal("TryWrite refused with nothing held")
						}
						waitFD(b, wfd, unix.POLLOUT)
						if _, err := c.TryFlush(); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				if fd {
					fdFlush(b, c, wfd)
					_ = unix.Shutdown(wfd, unix.SHUT_WR)
				} else {
					_ = c.raw.(interface{ CloseWrite() error }).CloseWrite()
				}
				<-done
			})
		}
	}
}
