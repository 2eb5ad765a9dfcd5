package server

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSON is Connect's JSON codec, except that it rejects unknown fields instead of
// dropping them (G6): a misspelt field in a hand-written request ("ttlMsec",
// "lockDelayMS") would otherwise be ignored silently and the request served with the
// default — a shorter TTL, no lock-delay. Connect answers the error InvalidArgument,
// naming the field. The binary encodings (Connect proto, gRPC, the fast lane) still skip
// unknown fields, so newer clients keep working against older servers there.
type strictJSON struct{ name string }

// jsonCodecs replace Connect's two JSON codec names.
var jsonCodecs = []strictJSON{{"json"}, {"json; charset=utf-8"}}

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) Marshal(msg any) ([]byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("server: %T is not a protobuf message", msg)
	}
	return protojson.Marshal(m)
}

func (c strictJSON) Unmarshal(b []byte, msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return fmt.Errorf("server: %T is not a protobuf message", msg)
	}
	if len(b) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	if err := protojson.Unmarshal(b, m); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", msg, err)
	}
	return nil
}
