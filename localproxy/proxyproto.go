package localproxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"time"
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

// localHeader returns the PROXY protocol header of a connection the proxy
// opens on its own behalf (a health probe), which carries no client
// addresses: v1 "PROXY UNKNOWN", v2 the LOCAL command. The receiver uses
// the connection's own addresses.
func localHeader(v ProxyProtocol) ([]byte, error) {
	switch v {
	case ProxyProtocolV1:
		return []byte("PROXY UNKNOWN\r\n"), nil
	case ProxyProtocolV2:
		b := append([]byte(nil), proxyV2Signature...)
		// Version 2, LOCAL command; AF_UNSPEC, UNSPEC; no addresses.
		return append(b, 0x20, 0x00, 0x00, 0x00), nil
	}
	return nil, fmt.Errorf("PROXY protocol: no header for version %q", v)
}

// ProbeDialer returns a dial function for health probes (see
// endpoint.Prober.DialContext) that sends v's LOCAL header on each new
// connection, so that endpoints behind a proxy requiring the PROXY
// protocol accept probes as they accept proxied clients. New uses it for
// the Prober of Config.Probe when Config.ProxyProtocol is set.
func ProbeDialer(v ProxyProtocol) (func(ctx context.Context, network, address string) (net.Conn, error), error) {
	hdr, err := localHeader(v)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		var nd net.Dialer
		nc, err := nd.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		deadline, _ := ctx.Deadline()
		if err := writeHeader(nc, hdr, deadline); err != nil {
			nc.Close()
			return nil, fmt.Errorf("sending the PROXY protocol header: %w", err)
		}
		return nc, nil
	}, nil
}

// writeHeader writes a PROXY protocol header to an upstream connection,
// giving up at deadline (the zero time: none), and clears the write
// deadline again.
func writeHeader(nc net.Conn, hdr []byte, deadline time.Time) error {
	nc.SetWriteDeadline(deadline)
	_, err := nc.Write(hdr)
	nc.SetWriteDeadline(time.Time{})
	return err
}
