package fastlane

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	leaseholdv1 "github.com/leasehold/leasehold/api/leasehold/v1"
)

// Method identifies an RPC on the fast lane. The numbers are the `fast_lane` option of the
// RPCs in proto/leasehold/v1/leasehold.proto — the one list of what the fast lane
// carries — and are part of the protocol.
type Method uint8

// method is what both ends need to know about one fast-lane method.
type method struct {
	procedure string // the Connect procedure, e.g. "/leasehold.v1.LockService/Acquire"
	request   protoreflect.MessageType
	response  protoreflect.MessageType
}

var (
	methods     [256]*method // by Method; nil: not carried
	byProcedure = map[string]Method{}
	byRequest   = map[protoreflect.FullName]Method{}
)

func init() {
	services := leaseholdv1.File_leasehold_v1_leasehold_proto.Services()
	takes := map[protoreflect.FullName]int{} // how many RPCs take each request type
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			takes[sd.Methods().Get(j).Input().FullName()]++
		}
	}
	for i := range services.Len() {
		sd := services.Get(i)
		for j := range sd.Methods().Len() {
			md := sd.Methods().Get(j)
			n, _ := proto.GetExtension(md.Options(), leaseholdv1.E_FastLane).(uint32)
			if n == 0 {
				continue
			}
			if n > 255 || methods[n] != nil || md.IsStreamingClient() || md.IsStreamingServer() || takes[md.Input().FullName()] != 1 {
				panic(fmt.Sprintf("fastlane: %s: fast_lane %d is out of range, taken, on a stream, or its request type is another RPC's too", md.FullName(), n))
			}
			req, err1 := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
			resp, err2 := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
			if err1 != nil || err2 != nil {
				panic(fmt.Sprintf("fastlane: %s: message types not registered", md.FullName()))
			}
			m := &method{procedure: "/" + string(sd.FullName()) + "/" + string(md.Name()), request: req, response: resp}
			methods[n] = m
			byProcedure[m.procedure] = Method(n)
			byRequest[md.Input().FullName()] = Method(n)
		}
	}
}

// MethodOf returns the fast-lane method of a Connect procedure, and false when the fast
// lane does not carry it.
func MethodOf(procedure string) (Method, bool) {
	m, ok := byProcedure[procedure]
	return m, ok
}

// Procedure returns the Connect procedure of m ("" when the fast lane has no method m).
func (m Method) Procedure() string {
	if d := methods[m]; d != nil {
		return d.procedure
	}
	return ""
}

// NewRequest returns an empty request message of m, or nil when the fast lane has no
// method m.
func (m Method) NewRequest() proto.Message {
	if d := methods[m]; d != nil {
		return d.request.New().Interface()
	}
	return nil
}

// NewResponse returns an empty response message of m, or nil when the fast lane has no
// method m.
func (m Method) NewResponse() proto.Message {
	if d := methods[m]; d != nil {
		return d.response.New().Interface()
	}
	return nil
}

// Methods returns every method the fast lane carries, in number order.
func Methods() []Method {
	var out []Method
	for n, d := range methods {
		if d != nil {
			out = append(out, Method(n))
		}
	}
	return out
}

func (m Method) String() string {
	if p := m.Procedure(); p != "" {
		return p
	}
	return fmt.Sprintf("method(%d)", uint8(m))
}

// MethodFor returns the fast-lane method whose request message is req's type, and false
// when the fast lane carries no RPC taking it. Every RPC of a fast-lane method has a
// request type of its own (init checks), so the type names the RPC.
func MethodFor(req proto.Message) (Method, bool) {
	m, ok := byRequest[req.ProtoReflect().Descriptor().FullName()]
	return m, ok
}

// MustMethodOf is MethodOf for a procedure known to be on the fast lane; it panics
// otherwise. For tables and tests.
func MustMethodOf(procedure string) Method {
	m, ok := MethodOf(procedure)
	if !ok {
		panic("fastlane: " + procedure + " is not on the fast lane")
	}
	return m
}
