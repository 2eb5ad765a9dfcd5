package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"connectrpc.com/connect"
)

// wire is one of the ways a request reaches a procedure over HTTP.
type wire uint8

const (
	connectJSON  wire = iota // Connect's unary protocol, JSON
	connectProto             // Connect's unary protocol, binary protobuf
	grpcWire                 // gRPC over h2c
	grpcWebWire              // gRPC-Web over HTTP/1.1
)

func (w wire) String() string {
	return [...]string{"connect+json", "connect+proto", "grpc", "grpc-web"}[w]
}

// envelope frames msg as one gRPC message with the given flags.
func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// rawClients holds the HTTP clients rawCall uses: HTTP/1.1 for Connect and gRPC-Web,
// h2c for gRPC.
type rawClients struct{ h1, h2 *http.Client }

func newRawClients() rawClients {
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	return rawClients{h1: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}, h2: &http.Client{Transport: h2}}
}

func (c rawClients) close() {
	c.h1.CloseIdleConnections()
	c.h2.CloseIdleConnections()
}

// rawAnswer is what the server answered a raw call: its code (0 for OK) and message.
type rawAnswer struct {
	code    connect.Code
	message string
}

// rawCall sends body, as it is (already enveloped for gRPC and gRPC-Web), to procedure
// over w and returns the answer. header adds request headers. An error means no answer
// could be read at all.
//
// A server stream over Connect takes its one request enveloped, as Connect's streaming
// protocol carries it; rawCall envelopes body itself and reads the end of the stream.
func (c rawClients) rawCall(ctx context.Context, base, procedure string, w wire, body []byte, header http.Header) (rawAnswer, error) {
	stream := isStream(procedure) && (w == connectJSON || w == connectProto)
	prefix := "application/"
	if stream {
		body, prefix = envelope(0, body), "application/connect+"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+procedure, bytes.NewReader(body))
	if err != nil {
		return rawAnswer{}, err
	}
	hc := c.h1
	switch w {
	case connectJSON:
		req.Header.Set("Content-Type", prefix+"json")
	case connectProto:
		req.Header.Set("Content-Type", prefix+"proto")
	case grpcWire:
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		hc = c.h2
	case grpcWebWire:
		req.Header.Set("Content-Type", "application/grpc-web+proto")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		return rawAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return rawAnswer{}, err
	}
	switch w {
	case connectJSON, connectProto:
		if stream && resp.StatusCode == http.StatusOK {
			return connectStreamEnd(b)
		}
		if resp.StatusCode == http.StatusOK {
			return rawAnswer{}, nil
		}
		var we wireError
		if err := json.Unmarshal(b, &we); err != nil {
			return rawAnswer{}, fmt.Errorf("status %d, body %q is not a Connect error: %w", resp.StatusCode, b, err)
		}
		var a rawAnswer
		if err := a.code.UnmarshalText([]byte(we.Code)); err != nil {
			return rawAnswer{}, fmt.Errorf("code %q: %w", we.Code, err)
		}
		a.message = we.Message
		return a, nil
	case grpcWire:
		return grpcStatus(resp.Trailer, resp.Header)
	}
	// gRPC-Web: the status is in the headers (a trailers-only answer) or in the body's
	// trailer frame (flag 0x80).
	if resp.Header.Get("Grpc-Status") != "" {
		return grpcStatus(resp.Header, nil)
	}
	for len(b) >= 5 {
		flags, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			break
		}
		if flags&0x80 != 0 {
			tr, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(b[5:5+n:5+n], "\r\n"...)))).ReadMIMEHeader()
			if err != nil && !errors.Is(err, io.EOF) {
				return rawAnswer{}, fmt.Errorf("gRPC-Web trailers %q: %w", b[5:5+n], err)
			}
			return grpcStatus(http.Header(tr), nil)
		}
		b = b[5+n:]
	}
	return rawAnswer{}, fmt.Errorf("gRPC-Web answer (status %d) without grpc-status", resp.StatusCode)
}

// connectStreamEnd reads the end-of-stream message (flag 0x02) of a Connect stream's
// answer b: its error, or none.
func connectStreamEnd(b []byte) (rawAnswer, error) {
	for len(b) >= 5 {
		flags, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			break
		}
		if flags&0x02 != 0 {
			var end struct {
				Error *wireError `json:"error"`
			}
			if err := json.Unmarshal(b[5:5+n], &end); err != nil {
				return rawAnswer{}, fmt.Errorf("end of stream %q: %w", b[5:5+n], err)
			}
			if end.Error == nil {
				return rawAnswer{}, nil
			}
			var a rawAnswer
			if err := a.code.UnmarshalText([]byte(end.Error.Code)); err != nil {
				return rawAnswer{}, fmt.Errorf("code %q: %w", end.Error.Code, err)
			}
			a.message = end.Error.Message
			return a, nil
		}
		b = b[5+n:]
	}
	return rawAnswer{}, errors.New("Connect stream answer without an end-of-stream message")
}

// grpcStatus reads grpc-status and grpc-message from h, or else from fallback.
func grpcStatus(h, fallback http.Header) (rawAnswer, error) {
	if h.Get("Grpc-Status") == "" && fallback != nil {
		h = fallback
	}
	st := h.Get("Grpc-Status")
	code, err := strconv.Atoi(strings.TrimSpace(st))
	if err != nil {
		return rawAnswer{}, fmt.Errorf("grpc-status %q: %w", st, err)
	}
	msg, _ := url.PathUnescape(h.Get("Grpc-Message"))
	return rawAnswer{code: connect.Code(code), message: msg}, nil
}
