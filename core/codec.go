package core

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Encoding versions. The first byte of every encoded command and snapshot names its
// format, so that the format can change without breaking old logs.
const (
	commandV1 = 1
)

// MaxCommandSize bounds an encoded command; larger input is rejected as corrupt.
const MaxCommandSize = 64 << 10

// EncodeCommand encodes c for the replicated log, in the binary version-2 format
// (command.go). A command larger than MaxCommandSize is refused with ErrInvalid.
func EncodeCommand(c Command) ([]byte, error) {
	b := appendCommand(make([]byte, 0, commandSize(c)), c)
	if len(b) > MaxCommandSize {
		// Every replica would skip it as corrupt: refuse it here instead.
		return nil, fmt.Errorf("%w: command of %d bytes exceeds %d", ErrInvalid, len(b), MaxCommandSize)
	}
	return b, nil
}

// DecodeCommand decodes a command written by EncodeCommand, in either format: version 2
// (binary) or version 1 (JSON, written before version 2 existed). Any malformed input
// yields an error wrapping ErrCorrupt, never a panic.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) == 0 || len(b) > MaxCommandSize {
		return Command{}, fmt.Errorf("%w: command of %d bytes", ErrCorrupt, len(b))
	}
	switch b[0] {
	case commandV2:
		return decodeCommandV2(b[1:])
	case commandV1:
		return decodeCommandV1(b[1:])
	default:
		return Command{}, fmt.Errorf("%w: command version %d", ErrCorrupt, b[0])
	}
}

// decodeCommandV1 decodes the body of a version-1 (JSON) command. It is a function of
// its own so that the command JSON decodes into, which escapes, is not the one
// DecodeCommand returns for version 2: that one stays on the caller's stack.
func decodeCommandV1(b []byte) (Command, error) {
	var c Command
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Command{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Command{}, fmt.Errorf("%w: trailing data after the command", ErrCorrupt)
	}
	return c, nil
}
