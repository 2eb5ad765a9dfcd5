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
func (c rawClients) rawCall(ctx context.Context, base, procedure string, w wire, body []byte, header http.Header) (rawAnswer, error) {
	stream := isStream(procedure) && (w == connectJSON || w == connectProto)
	if stream {
		body = envelope(0, body) // Connect's streaming protocol: the one request enveloped
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+procedure, bytes.NewReader(body))
	if err != nil {
		return rawAnswer{}, err
	}
	hc := c.h1
	switch {
	case stream && w == connectJSON:
		req.Header.Set("Content-Type", "application/connect+json")
	case stream:
		req.Header.Set("Content-Type", "application/connect+proto")
	case w == connectJSON:
		req.Header.Set("Content-Type", "application/json")
	case w == connectProto:
		req.Header.Set("Content-Type", "application/proto")
	case w == grpcWire:
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		hc = c.h2
	case w == grpcWebWire:
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
	if stream {
		return connectStreamEnd(resp.StatusCode, b)
	}
	switch w {
	case connectJSON, connectProto:
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

// connectStreamEnd reads the answer of a Connect server stream: its messages, then the
// end-of-stream message (flag 0x02) with the error, if any.
func connectStreamEnd(status int, b []byte) (rawAnswer, error) {
	if status != http.StatusOK {
		return rawAnswer{}, fmt.Errorf("stream answered status %d, body %q", status, b)
	}
	for len(b) >= 5 {
		flags, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 5+n {
			break
		}
		if flags&2 != 0 {
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
	return rawAnswer{}, fmt.Errorf("stream ended without its end message: %q", b)
}
