package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
)

// isServerStream reports whether procedure ("/pkg.Service/Method") streams answers.
func isServerStream(procedure string) bool {
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

// connectPost sends body (a binary request) to procedure over Connect, with the bearer
// token if any, and returns the error's JSON object — a unary call's error body, or a
// server stream's end-of-stream error — or nil when the call was served (a unary 200,
// or a stream's first message).
func connectPost(t *testing.T, addr, procedure, token string, body []byte) []byte {
	t.Helper()
	stream := isServerStream(procedure)
	ctype := "application/proto"
	if stream {
		ctype = "application/connect+proto"
		env := make([]byte, 5, 5+len(body))
		binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
		body = append(env, body...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+procedure, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", ctype)
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !stream || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/connect+") {
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		return b
	}
	var head [5]byte
	if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
		t.Fatalf("%s: stream ended without an end-of-stream message: %v", procedure, err)
	}
	msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
	if _, err := io.ReadFull(resp.Body, msg); err != nil {
		t.Fatalf("%s: stream message: %v", procedure, err)
	}
	if head[0]&2 == 0 {
		return nil // a message: served
	}
	var end struct {
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(msg, &end); err != nil {
		t.Fatalf("%s: end of stream %q: %v", procedure, msg, err)
	}
	return end.Error
}
