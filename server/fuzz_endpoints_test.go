package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
	"github.com/leasehold/leasehold/fastlane"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/server"
)

// The fuzz of every endpoint (G6): mutated requests to every procedure of the method
// table over Connect JSON, Connect proto, gRPC, gRPC-Web and the fast lane. No answer
// may be Internal or Unknown, every request is answered within its deadline, no
// connection is dropped, and the server still serves afterwards. TestFuzzEndpoints
// runs a fixed, seeded set of mutations in the normal suite; FuzzEndpoints lets `go
// test -fuzz` search further.

// fastWire is the fast lane, next to the HTTP wires of rawrpc_test.go.
const fastWire wire = grpcWebWire + 1

var allWires = []wire{connectJSON, connectProto, grpcWire, grpcWebWire, fastWire}

func wireName(w wire) string {
	if w == fastWire {
		return "fast-lane"
	}
	return w.String()
}

// noMembership is the node as the fuzzed server sees it, except that membership changes
// are refused (Unavailable) instead of made: a mutated AddMember that got through
// would leave the one-node cluster without a quorum, and the rest of the run would
// test nothing.
type noMembership struct{ *replication.Node }

func (noMembership) AddVoter(context.Context, string, string) error { return replication.ErrNotLeader }
func (noMembership) RemoveServer(context.Context, string) error     { return replication.ErrNotLeader }

// endpoints is a fuzzed server and what the fuzz knows about it.
type endpoints struct {
	s          *stack
	fastAddr   string
	procedures []string
	raw        rawClients

	mu      sync.Mutex
	lease   string // a live lease the seeds use
	counts  map[wire]map[connect.Code]int
	unnamed map[wire]int // InvalidArgument answers that name no field
}

// namesField matches a message that starts with the field at fault.
var namesField = regexp.MustCompile(`^(unmarshal message: )?[A-Za-z_][A-Za-z0-9_.]*: `)

func startEndpoints(tb testing.TB) *endpoints {
	s := startStack(tb, stackOpts{raft: func(n *replication.Node) server.Raft { return noMembership{n} }})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.srv.ServeFastLane(ln, slog.New(slog.DiscardHandler))
	}()
	tb.Cleanup(func() { _ = ln.Close(); <-done })
	e := &endpoints{s: s, fastAddr: ln.Addr().String(), procedures: server.Procedures(s.srv), raw: newRawClients(), counts: make(map[wire]map[connect.Code]int), unnamed: make(map[wire]int)}
	tb.Cleanup(e.raw.close)
	e.renewLease(tb)
	return e
}

func (e *endpoints) renewLease(tb testing.TB) {
	res, err := e.s.leases.Grant(context.Background(), &leaseholdv1.GrantRequest{TtlMs: 60_000})
	if err != nil {
		tb.Fatalf("Grant: %v", err)
	}
	e.mu.Lock()
	e.lease = res.LeaseId
	e.mu.Unlock()
}

// seed is a valid request to procedure, made from its fields' names.
func (e *endpoints) seed(procedure string) proto.Message {
	e.mu.Lock()
	lease := e.lease
	e.mu.Unlock()
	md := methodInput(procedure)
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		panic(err)
	}
	m := mt.New()
	fill(m, lease)
	return m.Interface()
}

func methodInput(procedure string) protoreflect.MessageDescriptor {
	services := leaseholdv1.File_leasehold_v1_leasehold_proto.Services()
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			if md := sd.Methods().Get(j); "/"+string(sd.FullName())+"/"+string(md.Name()) == procedure {
				return md.Input()
			}
		}
	}
	panic("no procedure " + procedure)
}

// fill sets m's fields to plausible values, by name.
func fill(m protoreflect.Message, lease string) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsList() || fd.IsMap() || fd.ContainingOneof() != nil { // optional if_version: unset
			continue
		}
		var v protoreflect.Value
		switch name := string(fd.Name()); {
		case fd.Message() != nil:
			sub := m.NewField(fd).Message()
			fill(sub, lease)
			v = protoreflect.ValueOfMessage(sub)
		case name == "lease_id":
			v = protoreflect.ValueOfString(lease)
		case strings.HasSuffix(name, "addr"):
			v = protoreflect.ValueOfString("127.0.0.1:1")
		case name == "node_id":
			v = protoreflect.ValueOfString("fuzz-node")
		case fd.Kind() == protoreflect.StringKind:
			v = protoreflect.ValueOfString("fuzz/" + name)
		case fd.Kind() == protoreflect.BytesKind:
			v = protoreflect.ValueOfBytes([]byte("value"))
		case fd.Kind() == protoreflect.BoolKind:
			v = protoreflect.ValueOfBool(false)
		case fd.Kind() == protoreflect.EnumKind:
			v = protoreflect.ValueOfEnum(2) // LOCK_CLASS_CORRECTNESS
		case name == "ttl_ms":
			v = protoreflect.ValueOfInt64(5000)
		case fd.Kind() == protoreflect.Int64Kind:
			v = protoreflect.ValueOfInt64(0)
		case fd.Kind() == protoreflect.Uint64Kind:
			v = protoreflect.ValueOfUint64(1)
		case fd.Kind() == protoreflect.Uint32Kind:
			v = protoreflect.ValueOfUint32(10)
		default:
			continue
		}
		m.Set(fd, v)
	}
}

// encode is req as w carries it: JSON, or binary (enveloped for gRPC and gRPC-Web).
func encode(w wire, req proto.Message) []byte {
	if w == connectJSON {
		b, _ := protojson.Marshal(req)
		return b
	}
	b, _ := proto.Marshal(req)
	if w == grpcWire || w == grpcWebWire {
		return envelope(0, b)
	}
	return b
}

// call sends body to procedure over w and returns the answer's code (0 for OK); an
// error is a failure of G6 itself (no answer in time, a dropped connection).
func (e *endpoints) call(procedure string, w wire, body []byte) (connect.Code, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if w == fastWire {
		return e.fastCall(ctx, procedure, body)
	}
	// Bound what the server may wait for (a mutated wait_ms on a held lock).
	h := http.Header{"Connect-Timeout-Ms": {"2000"}, "Grpc-Timeout": {"2S"}}
	a, err := e.raw.rawCall(ctx, e.s.url, procedure, w, body, h)
	return a.code, a.message, err
}

// fastCall sends one request frame on a fresh fast-lane connection; after 2s without
// an answer it cancels the request, as a client whose context ended would.
func (e *endpoints) fastCall(ctx context.Context, procedure string, payload []byte) (connect.Code, string, error) {
	m, ok := fastlane.MethodOf(procedure)
	if !ok {
		return 0, "", errors.New("not on the fast lane")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", e.fastAddr)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	if _, err := fastlane.ClientHello(conn, ""); err != nil {
		return 0, "", err
	}
	frame, err := fastlane.AppendFrame(nil, fastlane.KindRequest, m, 1, func(b []byte) ([]byte, error) { return append(b, payload...), nil })
	if err != nil {
		return connect.CodeResourceExhausted, "frame too large", nil // the client refuses it itself
	}
	if _, err := conn.Write(frame); err != nil {
		return 0, "", err
	}
	cancelAt := time.Now().Add(2 * time.Second)
	dl, _ := ctx.Deadline()
	r := fastlane.NewReader(conn)
	for {
		_ = conn.SetReadDeadline(cancelAt)
		f, err := r.Read()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && !cancelAt.Equal(dl) {
			cancel, _ := fastlane.AppendFrame(nil, fastlane.KindCancel, m, 1, nil)
			_, _ = conn.Write(cancel)
			cancelAt = dl
			continue
		}
		if err != nil {
			return 0, "", fmt.Errorf("no answer: %w", err)
		}
		switch f.Kind {
		case fastlane.KindResponse:
			return 0, "", nil
		case fastlane.KindError:
			var fe leaseholdv1.FastLaneError
			if err := proto.Unmarshal(f.Payload, &fe); err != nil {
				return 0, "", fmt.Errorf("error frame does not decode: %w", err)
			}
			return connect.Code(fe.GetCode()), fe.GetMessage(), nil
		}
	}
}

// check sends one request and fails tb on a G6 violation.
func (e *endpoints) check(tb testing.TB, procedure string, w wire, body []byte) {
	code, msg, err := e.call(procedure, w, body)
	if err != nil {
		tb.Errorf("%s over %s, body %q: %v", procedure, wireName(w), body, err)
		return
	}
	switch code {
	case connect.CodeInternal, connect.CodeUnknown:
		tb.Errorf("%s over %s, body %q: %v %q", procedure, wireName(w), body, code, msg)
	}
	if goTypeName.MatchString(msg) {
		tb.Errorf("%s over %s, body %q: %q names a Go type", procedure, wireName(w), body, msg)
	}
	if code == 0 && strings.HasSuffix(procedure, "/Revoke") {
		e.renewLease(tb) // keep a live lease for the seeds
	}
	e.mu.Lock()
	if e.counts[w] == nil {
		e.counts[w] = make(map[connect.Code]int)
	}
	e.counts[w][code]++
	if code == connect.CodeInvalidArgument && !namesField.MatchString(msg) {
		e.unnamed[w]++
	}
	e.mu.Unlock()
}

// report logs the answers by wire and code.
func (e *endpoints) report(tb testing.TB) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var lines []string
	for _, w := range allWires {
		var parts []string
		total := 0
		for code, n := range e.counts[w] {
			name := "ok"
			if code != 0 {
				name = code.String()
			}
			parts = append(parts, fmt.Sprintf("%s %d", name, n))
			total += n
		}
		sort.Strings(parts)
		lines = append(lines, fmt.Sprintf("%s: %d requests: %s (invalid_argument naming no field: %d)", wireName(w), total, strings.Join(parts, ", "), e.unnamed[w]))
	}
	return strings.Join(lines, "\n")
}

// mutate changes b a little, in the ways that broke servers before: bits flipped, cut
// short, bytes inserted, dropped or repeated, JSON values replaced and keys added,
// protobuf fields appended with any wire type, envelopes with other flags and lengths.
func mutate(r *rand.Rand, w wire, b []byte) []byte {
	out := slices.Clone(b)
	body := out
	var env []byte
	if w == grpcWire || w == grpcWebWire {
		env, body = out[:5], out[5:]
	}
	interesting := []byte{0, 0xff, 0x80, 0x7f, '"', '{', '}', '[', ',', ':', '\\', '-', '9', 'e', 'n'}
	for range 1 + r.IntN(2) {
		switch op := r.IntN(8); {
		case op == 0 && len(body) > 0:
			body[r.IntN(len(body))] ^= 1 << r.IntN(8)
		case op == 1 && len(body) > 0:
			body = body[:r.IntN(len(body))]
		case op == 2:
			at := r.IntN(len(body) + 1)
			ins := make([]byte, 1+r.IntN(8))
			for i := range ins {
				ins[i] = byte(r.Uint32())
			}
			body = slices.Insert(body, at, ins...)
		case op == 3 && len(body) > 1:
			i := r.IntN(len(body))
			body = slices.Delete(body, i, min(len(body), i+1+r.IntN(4)))
		case op == 4 && len(body) > 0:
			i := r.IntN(len(body))
			j := min(len(body), i+1+r.IntN(16))
			body = slices.Insert(body, j, body[i:j]...)
		case op == 5 && len(body) > 0:
			body[r.IntN(len(body))] = interesting[r.IntN(len(interesting))]
		case op == 6 && w == connectJSON:
			body = replaceJSONValue(r, body)
		case op == 6:
			body = appendField(r, body)
		case op == 7 && w == connectJSON && len(body) > 1 && body[0] == '{':
			key := []string{`"zz":1,`, `"ttlMs":`, `"":null,`, `"name":"a",`, `"holder":{"x":[]},`}[r.IntN(5)]
			body = slices.Insert(body, 1, []byte(key)...)
		case op == 7:
			body = protowire.AppendVarint(protowire.AppendTag(body, protowire.Number(1+r.IntN(8)), protowire.VarintType), ^uint64(0)>>r.IntN(64))
		}
	}
	if env == nil {
		return body
	}
	env = slices.Clone(env)
	putLen := func(n uint32) { env[1], env[2], env[3], env[4] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n) }
	putLen(uint32(len(body)))
	switch r.IntN(6) {
	case 0:
		env[0] = byte(r.Uint32())
	case 1:
		putLen(uint32(len(body) + 1 + r.IntN(64)))
	case 2:
		putLen(r.Uint32())
	case 3:
		body = append(body, byte(r.Uint32()), byte(r.Uint32()))
	}
	return append(env, body...)
}

// replaceJSONValue puts a JSON value of another kind after one of b's colons.
func replaceJSONValue(r *rand.Rand, b []byte) []byte {
	var colons []int
	for i, c := range b {
		if c == ':' {
			colons = append(colons, i)
		}
	}
	if len(colons) == 0 {
		return b
	}
	at := colons[r.IntN(len(colons))] + 1
	end := at
	for end < len(b) && b[end] != ',' && b[end] != '}' {
		end++
	}
	values := []string{`null`, `true`, `-1`, `1e400`, `18446744073709551616`, `"x"`, `""`, `{}`, `[]`, `[1,"a"]`, `{"a":{"b":{}}}`, `"\ud800"`, `0.5`, `"-9223372036854775809"`}
	return slices.Concat(b[:at], []byte(values[r.IntN(len(values))]), b[end:])
}

// appendField appends a field with a random number and wire type, and random contents.
func appendField(r *rand.Rand, b []byte) []byte {
	num := protowire.Number(1 + r.IntN(12))
	switch r.IntN(5) {
	case 0:
		return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), r.Uint64())
	case 1:
		return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), r.Uint64())
	case 2:
		return protowire.AppendFixed32(protowire.AppendTag(b, num, protowire.Fixed32Type), r.Uint32())
	case 3:
		junk := make([]byte, r.IntN(12))
		for i := range junk {
			junk[i] = byte(r.Uint32())
		}
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), junk)
	}
	return protowire.AppendTag(b, num, protowire.StartGroupType) // a group never ended
}

// TestFuzzEndpoints sends a fixed set of mutated requests (2,000; 400 with -short) to
// every procedure over every wire, and reports the answers by code.
func TestFuzzEndpoints(t *testing.T) {
	e := startEndpoints(t)
	n := 2000
	if testing.Short() {
		n = 400
	}
	type input struct {
		procedure string
		w         wire
		body      []byte
	}
	r := rand.New(rand.NewPCG(17, 6))
	inputs := make([]input, 0, n)
	for len(inputs) < n {
		procedure := e.procedures[r.IntN(len(e.procedures))]
		w := allWires[r.IntN(len(allWires))]
		if _, ok := fastlane.MethodOf(procedure); w == fastWire && !ok {
			continue
		}
		inputs = append(inputs, input{procedure, w, mutate(r, w, encode(w, e.seed(procedure)))})
	}
	work := make(chan input)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for in := range work {
				e.check(t, in.procedure, in.w, in.body)
			}
		})
	}
	for _, in := range inputs {
		work <- in
	}
	close(work)
	wg.Wait()
	t.Logf("answers by wire and code:\n%s", e.report(t))
	checkServes(t, e.s)
}

// FuzzEndpoints: any body, to any procedure over any wire, is answered without
// Internal or Unknown, in time, and the connection stays up.
func FuzzEndpoints(f *testing.F) {
	e := startEndpoints(f)
	for i, procedure := range e.procedures {
		for j, w := range allWires {
			if _, ok := fastlane.MethodOf(procedure); w == fastWire && !ok {
				continue
			}
			f.Add(uint8(i), uint8(j), encode(w, e.seed(procedure)))
		}
	}
	f.Fuzz(func(t *testing.T, procedure, w uint8, body []byte) {
		p := e.procedures[int(procedure)%len(e.procedures)]
		wi := allWires[int(w)%len(allWires)]
		if _, ok := fastlane.MethodOf(p); wi == fastWire && !ok {
			wi = connectProto
		}
		e.check(t, p, wi, body)
	})
}
