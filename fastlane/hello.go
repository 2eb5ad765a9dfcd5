package fastlane

import (
	"encoding/binary"
	"fmt"
	"io"
	"unicode/utf8"
)

// Hello extensions (docs/PROTOCOL.md, "Hello extensions"): optional type-length-value
// entries a client sends after the fixed handshake, offered and accepted through a bit
// of each side's flags, so that either side may be older than the other. A client with
// extensions sets FlagExtensions in its hello; a server that reads extensions sets it in
// its answer, and only then does the client send the block: 2 bytes of length (at most
// MaxExtensions), then entries of 1 byte type, 2 bytes length and the value. A server
// that does not know the bit answers without it and the client sends nothing more; a
// server ignores entries of types it does not know.
const (
	// FlagExtensions is the handshake flag bit of hello extensions.
	FlagExtensions uint16 = 0x0001
	// FlagGoAway is the handshake flag bit of GOAWAY (KindGoAway): set by a client that
	// understands the frame, and in the server's answer by a server that will send it
	// before it closes the connection to shut down. A server that does not know the bit
	// answers without it, and never sends the frame.
	FlagGoAway uint16 = 0x0002
	// MaxExtensions bounds the extension block (without its 2-byte length).
	MaxExtensions = 4096
)

// ExtType is the type of one hello extension. Values are part of the protocol.
type ExtType uint8

// Extension types.
const (
	// ExtToken is a bearer token (UTF-8): the credential the server authorizes this
	// connection's requests with, as Connect's "Authorization: Bearer".
	ExtToken ExtType = 1
)

// Extensions are what a client's hello offers beside the fixed handshake: the hello
// extensions (Token) and the flags (GoAway). The zero value offers nothing.
type Extensions struct {
	Token string
	// GoAway: the client understands GOAWAY frames (FlagGoAway). On the server side
	// (ServerHello), the client asked for them and the server answered that it sends
	// them.
	GoAway bool
}

// flags returns the client's hello flags for e.
func (e Extensions) flags() uint16 {
	var f uint16
	if e.Token != "" {
		f |= FlagExtensions
	}
	if e.GoAway {
		f |= FlagGoAway
	}
	return f
}

// send writes e's block if the client offered it and the server's answer flags accept.
func (e Extensions) send(w io.Writer, serverFlags uint16) error {
	if e.flags()&FlagExtensions == 0 || serverFlags&FlagExtensions == 0 {
		return nil
	}
	b := []byte{0, 0}
	if e.Token != "" {
		b = append(b, byte(ExtToken))
		b = binary.BigEndian.AppendUint16(b, uint16(len(e.Token)))
		b = append(b, e.Token...)
	}
	if len(b)-2 > MaxExtensions {
		return fmt.Errorf("%w: hello extensions of %d bytes exceed %d", ErrProtocol, len(b)-2, MaxExtensions)
	}
	binary.BigEndian.PutUint16(b, uint16(len(b)-2))
	_, err := w.Write(b)
	return err
}

// receiveExtensions reads the client's extension block when the server's answer
// accepted one (accepted has FlagExtensions).
func receiveExtensions(r io.Reader, accepted uint16) (Extensions, error) {
	var e Extensions
	if accepted&FlagExtensions == 0 {
		return e, nil
	}
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return e, err
	}
	size := int(binary.BigEndian.Uint16(n[:]))
	if size > MaxExtensions {
		return e, fmt.Errorf("%w: hello extensions of %d bytes exceed %d", ErrProtocol, size, MaxExtensions)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return e, err
	}
	seen := map[ExtType]bool{}
	for len(b) > 0 {
		if len(b) < 3 {
			return e, fmt.Errorf("%w: truncated hello extension", ErrProtocol)
		}
		t, l := ExtType(b[0]), int(binary.BigEndian.Uint16(b[1:3]))
		if len(b) < 3+l {
			return e, fmt.Errorf("%w: hello extension %d of %d bytes overruns the block", ErrProtocol, t, l)
		}
		v := b[3 : 3+l]
		b = b[3+l:]
		if seen[t] {
			return e, fmt.Errorf("%w: hello extension %d twice", ErrProtocol, t)
		}
		seen[t] = true
		if t == ExtToken {
			if l == 0 || !utf8.Valid(v) {
				return e, fmt.Errorf("%w: hello token must be non-empty UTF-8", ErrProtocol)
			}
			e.Token = string(v)
		}
	}
	return e, nil
}
