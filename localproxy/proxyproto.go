package localproxy

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
)

// proxyV2Signature starts every PROXY protocol v2 header.
var proxyV2Signature = []byte("\r\n\r\n\x00\r\nQUIT\n")

// proxyHeader returns the PROXY protocol header for a TCP connection from
// src to dst (the client's address and the proxy's listening address).
func proxyHeader(v ProxyProtocol, src, dst net.Addr) ([]byte, error) {
	s, ok1 := src.(*net.TCPAddr)
	d, ok2 := dst.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("PROXY protocol: not a TCP connection (%v -> %v)", src, dst)
	}
	s4, d4 := s.IP.To4(), d.IP.To4()
	v4 := s4 != nil && d4 != nil
	switch v {
	case ProxyProtocolV1:
		fam, sip, dip := "TCP6", s.IP.String(), d.IP.String()
		if v4 {
			fam, sip, dip = "TCP4", s4.String(), d4.String()
		}
		return []byte("PROXY " + fam + " " + sip + " " + dip + " " + strconv.Itoa(s.Port) + " " + strconv.Itoa(d.Port) + "\r\n"), nil
	case ProxyProtocolV2:
		b := append([]byte(nil), proxyV2Signature...)
		b = append(b, 0x21) // version 2, PROXY command
		if v4 {
			b = append(b, 0x11) // AF_INET, STREAM
			b = binary.BigEndian.AppendUint16(b, 12)
			b = append(b, s4...)
			b = append(b, d4...)
		} else {
			b = append(b, 0x21) // AF_INET6, STREAM
			b = binary.BigEndian.AppendUint16(b, 36)
			b = append(b, s.IP.To16()...)
			b = append(b, d.IP.To16()...)
		}
		b = binary.BigEndian.AppendUint16(b, uint16(s.Port))
		b = binary.BigEndian.AppendUint16(b, uint16(d.Port))
		return b, nil
	}
	return nil, fmt.Errorf("PROXY protocol: unknown version %q", v)
}
