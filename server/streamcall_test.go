package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
)

// isStream reports whether procedure is a server-streaming RPC of the .proto file.
func isStream(procedure string) bool {
	services := leaseholdv1.File_leasehold_v1_leasehold_proto.Services()
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			if md := sd.Methods().Get(j); "/"+string(sd.FullName())+"/"+string(md.Name()) == procedure {
				return md.IsStreamingServer()
			}
		}
	}
	return false
}

// streamCall opens the server stream procedure with req over Connect's streaming
// protocol (token, if set, as a bearer token) and returns how it answered: code 0 when
// its first message came (the stream is then cut off), else the end-of-stream error's
// code, message and ErrorDetail reason.
func streamCall(t *testing.T, addr, procedure, token string, req proto.Message) (connect.Code, string, string) {
	t.Helper()
	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	body = append(body, msg...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+procedure, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/connect+proto")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var head [5]byte
	if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
		t.Fatalf("%s: stream answer: %v", procedure, err)
	}
	payload := make([]byte, binary.BigEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(resp.Body, payload); err != nil {
		t.Fatalf("%s: stream answer: %v", procedure, err)
	}
	if head[0]&2 == 0 {
		return 0, "", "" // a message: the stream is open
	}
	var end struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Details []struct {
				Type  string `json:"type"`
				Value string `json:"value"`
			} `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(payload, &end); err != nil || end.Error == nil {
		t.Fatalf("%s: end of stream %q: %v", procedure, payload, err)
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(end.Error.Code)); err != nil {
		t.Fatalf("%s: code %q: %v", procedure, end.Error.Code, err)
	}
	var d leaseholdv1.ErrorDetail
	for _, det := range end.Error.Details {
		if strings.HasSuffix(det.Type, "leasehold.v1.ErrorDetail") {
			b, _ := base64.RawStdEncoding.DecodeString(det.Value)
			if err := proto.Unmarshal(b, &d); err != nil {
				t.Fatal(err)
			}
		}
	}
	return code, end.Error.Message, d.GetReason()
}
