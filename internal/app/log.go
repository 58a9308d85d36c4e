package app

import (
	"errors"
	"net"
)

func splitHostPort(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", errors.New("want host:port")
	}
	return host, port, nil
}
