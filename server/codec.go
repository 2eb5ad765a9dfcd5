package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/leasehold/leasehold/core"
)

// The codecs Connect uses for requests and responses, in place of its own (G6). Both
// decode as Connect's do, except that:
//   - JSON rejects unknown fields instead of dropping them: a misspelt field in a
//     hand-written request ("ttlMsec", "lockDelayMS") would otherwise be ignored
//     silently and the request served with the default — a shorter TTL, no lock-delay.
//     The binary encoding (Connect proto, gRPC, the fast lane) still skips unknown
//     fields, so newer clients keep working against older servers there.
//   - A request that does not decode is answered with an error that names the field at
//     fault when one can be named (a *core.FieldError, "ttl_ms: must be an integer …"),
//     and never with a Go type name: Connect's own codecs say "unmarshal into
//     *leaseholdv1.GrantRequest". Connect answers it InvalidArgument, with the message;
//     the fast lane (decodeProto) also fills ErrorDetail.field.
//
// Finding the field costs a second pass over the request, on the error path only.
var codecs = []interface {
	Name() string
	Marshal(any) ([]byte, error)
	Unmarshal([]byte, any) error
}{strictJSON{"json"}, strictJSON{"json; charset=utf-8"}, binaryProto{}}

type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) Marshal(msg any) ([]byte, error) {
	m, err := asProto(msg)
	if err != nil {
		return nil, err
	}
	return protojson.Marshal(m)
}

func (c strictJSON) Unmarshal(b []byte, msg any) error {
	m, err := asProto(msg)
	if err != nil {
		return err
	}
	return decodeJSON(b, m)
}

// binaryProto is the binary protobuf codec ("proto", used by Connect's binary protocol,
// gRPC and gRPC-Web).
type binaryProto struct{}

func (binaryProto) Name() string { return "proto" }

func (binaryProto) Marshal(msg any) ([]byte, error) {
	m, err := asProto(msg)
	if err != nil {
		return nil, err
	}
	return proto.Marshal(m)
}

// MarshalAppend lets Connect reuse its buffers, as with its own codec.
func (binaryProto) MarshalAppend(dst []byte, msg any) ([]byte, error) {
	m, err := asProto(msg)
	if err != nil {
		return nil, err
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, m)
}

func (binaryProto) Unmarshal(b []byte, msg any) error {
	m, err := asProto(msg)
	if err != nil {
		return err
	}
	return decodeProto(b, m)
}

func asProto(msg any) (proto.Message, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, errors.New("server: not a protobuf message") // a bug of ours, not the caller's
	}
	return m, nil
}

// decodeProto decodes a request in the binary encoding. When it does not decode, the
// error is a *core.FieldError naming the field at fault if the bytes name one, else
// an error matching core.ErrInvalid.
func decodeProto(b []byte, m proto.Message) error {
	err := proto.Unmarshal(b, m)
	if err == nil {
		return nil
	}
	md := m.ProtoReflect().Descriptor()
	if field, reason := protoFault(b, md, ""); reason != "" {
		return undecodable(field, reason)
	}
	return requestFault("the request is not a valid protobuf encoding of " + string(md.FullName()))
}

// undecodable is the error for a request that does not decode: a *core.FieldError
// when field names the field at fault, else an error about the request as a whole.
func undecodable(field, reason string) error {
	if field == "" {
		return requestFault("the request " + reason)
	}
	return core.Invalid(field, "%s", reason)
}

// requestFault is what is wrong with a request that does not decode, when no field is
// to blame. It matches core.ErrInvalid (InvalidArgument).
type requestFault string

func (e requestFault) Error() string { return string(e) }

// Unwrap makes requestFault match core.ErrInvalid.
func (e requestFault) Unwrap() error { return core.ErrInvalid }

// protoFault walks the wire encoding of a message of type md and returns the first field
// (its path under prefix) that does not decode, and why; reason "" when it finds none.
func protoFault(b []byte, md protoreflect.MessageDescriptor, prefix string) (field, reason string) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return strings.TrimSuffix(prefix, "."), "holds bytes that are not a protobuf field (" + protoWords(protowire.ParseError(n)) + ")"
		}
		fd := md.Fields().ByNumber(num)
		v := b[n:]
		m := protowire.ConsumeFieldValue(num, typ, v)
		switch {
		case m < 0 && fd == nil:
			return strings.TrimSuffix(prefix, "."), fmt.Sprintf("holds field number %d, cut short or malformed (%s)", num, protoWords(protowire.ParseError(m)))
		case m < 0:
			return prefix + string(fd.Name()), "is cut short or malformed (" + protoWords(protowire.ParseError(m)) + ")"
		}
		v, b = v[:m], v[m:]
		if fd == nil || typ != protowire.BytesType {
			continue // skipped as unknown, or a scalar whose bytes parsed
		}
		name := prefix + string(fd.Name())
		val, _ := protowire.ConsumeBytes(v)
		switch {
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(val):
			return name, "must be valid UTF-8"
		case fd.Message() != nil: // a message, an item of a list of them, or a map entry
			if f, r := protoFault(val, fd.Message(), name+"."); r != "" {
				return f, r
			}
		}
	}
	return "", ""
}

// decodeJSON decodes a request in protobuf's JSON mapping, rejecting unknown fields.
// When it does not decode, the error is a *core.FieldError naming the field at fault
// if there is one, else an error matching core.ErrInvalid that says what is wrong.
func decodeJSON(b []byte, m proto.Message) error {
	if len(b) == 0 {
		return requestFault("the request is empty; it must be a JSON object")
	}
	err := protojson.Unmarshal(b, m)
	if err == nil {
		return nil
	}
	md := m.ProtoReflect().Descriptor()
	if field, reason := jsonFault(b, md); reason != "" {
		return undecodable(field, reason)
	}
	// protojson saw something the walk did not: its own words then (they name no Go
	// type).
	return requestFault(fmt.Sprintf("the request does not decode as %s: %s", md.FullName(), protoWords(err)))
}

// protoWords is a protobuf error's text without its "proto:" prefix (which the library
// writes with a space or, at random, a no-break space).
func protoWords(err error) string {
	return strings.TrimLeft(strings.TrimPrefix(err.Error(), "proto:"), " \u00a0")
}

// jsonFault finds why b is not the JSON of a message of type md: the field at fault
// ("" for the request as a whole) and the reason, or reason "" if it finds nothing.
func jsonFault(b []byte, md protoreflect.MessageDescriptor) (field, reason string) {
	w := jsonWalk{b: b, dec: json.NewDecoder(bytes.NewReader(b))}
	field, reason = w.object(md, "")
	if reason != "" {
		return field, reason
	}
	if _, err := w.dec.Token(); !errors.Is(err, io.EOF) {
		return "", "has more after its JSON object"
	}
	return "", ""
}

// jsonWalk reads a request's JSON token by token, to find the field at fault.
type jsonWalk struct {
	b   []byte
	dec *json.Decoder
}

// object reads one JSON object of message type md and returns the first fault in it.
// prefix is the object's path ("holder." inside AcquireRequest).
func (w jsonWalk) object(md protoreflect.MessageDescriptor, prefix string) (field, reason string) {
	whole := strings.TrimSuffix(prefix, ".")
	if tok, err := w.dec.Token(); err != nil {
		return whole, "is not valid JSON: " + jsonSyntax(err)
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return whole, "must be a JSON object"
	}
	seen := make(map[protoreflect.FieldNumber]bool)
	after := "" // the last field read, to say where the JSON broke
	broken := func(err error) (string, string) {
		if after == "" {
			return whole, "is not valid JSON: " + jsonSyntax(err)
		}
		return whole, "is not valid JSON after " + after + ": " + jsonSyntax(err)
	}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return broken(err)
		}
		key, _ := tok.(string)
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByTextName(key)
		}
		if fd == nil {
			return prefix + key, "is not a field of " + string(md.FullName())
		}
		name := prefix + string(fd.Name())
		if seen[fd.Number()] {
			return name, "is given twice"
		}
		seen[fd.Number()] = true
		after = name
		if fd.Message() != nil && !fd.IsList() && !fd.IsMap() && w.objectNext() {
			if f, r := w.object(fd.Message(), name+"."); r != "" {
				return f, r
			}
			continue
		}
		var raw json.RawMessage
		if err := w.dec.Decode(&raw); err != nil {
			return name, "is not valid JSON: " + jsonSyntax(err)
		}
		if r := jsonValueFault(md, key, raw, fd); r != "" {
			return name, r
		}
	}
	if _, err := w.dec.Token(); err != nil { // the closing brace
		return broken(err)
	}
	return "", ""
}

// objectNext reports whether the value after the key just read starts with '{'.
func (w jsonWalk) objectNext() bool {
	for _, c := range w.b[w.dec.InputOffset():] {
		switch c {
		case ' ', '\t', '\r', '\n', ':':
			continue
		}
		return c == '{'
	}
	return false
}

// jsonValueFault decodes {key: raw} alone into a message of type md and, if that
// fails, says what the field's value must be.
func jsonValueFault(md protoreflect.MessageDescriptor, key string, raw json.RawMessage, fd protoreflect.FieldDescriptor) string {
	k, _ := json.Marshal(key)
	one := append(append(append(append([]byte("{"), k...), ':'), raw...), '}')
	m := newMessage(md)
	if m == nil || protojson.Unmarshal(one, m) == nil {
		return ""
	}
	got := string(raw)
	if len(got) > 40 {
		got = strings.ToValidUTF8(got[:37], "") + "..."
	}
	want := kindWant(fd)
	if fd.IsList() {
		want = "must be an array whose items each " + strings.TrimPrefix(want, "must ")
	}
	return want + ", got " + got
}

// newMessage makes an empty message of type md, of its generated Go type.
func newMessage(md protoreflect.MessageDescriptor) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		return nil
	}
	return mt.New().Interface()
}

// kindWant says what a JSON value of field fd must be.
func kindWant(fd protoreflect.FieldDescriptor) string {
	if fd.IsMap() {
		return "must be an object of keys and values"
	}
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return "must be true or false"
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return "must be an integer that fits in 32 bits (a number or a string of digits)"
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return "must be a non-negative integer that fits in 32 bits (a number or a string of digits)"
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return "must be an integer that fits in 64 bits (a number or a string of digits)"
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return "must be a non-negative integer that fits in 64 bits (a number or a string of digits)"
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "must be a number"
	case protoreflect.StringKind:
		return "must be a string of valid UTF-8"
	case protoreflect.BytesKind:
		return "must be a string of base64"
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		names := make([]string, 0, vals.Len())
		for i := range vals.Len() {
			names = append(names, string(vals.Get(i).Name()))
		}
		return "must be one of " + strings.Join(names, ", ") + " (or its number)"
	}
	return "must be a JSON object of type " + string(fd.Message().FullName())
}

// jsonSyntax words a JSON syntax error without encoding/json's Go-isms.
func jsonSyntax(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "it ends too soon"
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	}
	return err.Error()
}
