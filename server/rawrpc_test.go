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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+procedure, bytes.NewReader(body))
	if err != nil {
		return rawAnswer{}, err
	}
	hc := c.h1
	stream := isServerStream(procedure) && (w == connectJSON || w == connectProto)
	switch {
	case stream:
		// Connect's streaming protocol: an enveloped request, and answers in envelopes
		// ending with an end-of-stream message (rawStreamAnswer).
		req.Body = io.NopCloser(bytes.NewReader(envelope(0, body)))
		req.ContentLength = int64(5 + len(body))
		req.Header.Set("Content-Type", "application/connect+proto")
		if w == connectJSON {
			req.Header.Set("Content-Type", "application/connect+json")
		}
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
	if stream {
		return rawStreamAnswer(resp)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return rawAnswer{}, err
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

// rawStreamAnswer reads a Connect server stream's answer: its first message (the call
// was served: OK, without waiting for the stream's end), or its end-of-stream message's
// error.
func rawStreamAnswer(resp *http.Response) (rawAnswer, error) {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/connect+") {
		b, _ := io.ReadAll(resp.Body)
		return rawAnswer{}, fmt.Errorf("status %d, content type %q, body %q: not a Connect stream", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var head [5]byte
	if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
		return rawAnswer{}, fmt.Errorf("stream ended without an end-of-stream message: %w", err)
	}
	msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(resp.Body, msg); err != nil {
		return rawAnswer{}, fmt.Errorf("stream message: %w", err)
	}
	if head[0]&2 == 0 {
		return rawAnswer{}, nil
	}
	var end struct {
		Error *wireError `json:"error"`
	}
	if err := json.Unmarshal(msg, &end); err != nil {
		return rawAnswer{}, fmt.Errorf("end of stream %q: %w", msg, err)
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
