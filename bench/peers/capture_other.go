//go:build !linux

package peers

import (
	"errors"
	"net"
	"syscall"
)

var errNotLinux = errors.New("peers: capture (SO_ORIGINAL_DST, SO_MARK) needs Linux")

func originalDst(net.Conn) (string, error) { return "", errNotLinux }

func markControl(int) func(network, address string, c syscall.RawConn) error {
	return func(string, string, syscall.RawConn) error { return errNotLinux }
}
