package core

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// The binary command format (version 2), written by EncodeCommand since v2 replaced the
// JSON format (version 1, still decoded so that logs written before stay readable).
//
//	byte     version (2)
//	byte     op
//	uvarint  field mask: bit i set means field i follows
//	fields   in the order of the table below, each only when its bit is set
//
// Fields are written only when they differ from their zero value, so one command has
// one encoding; a decoder rejects a present field that holds the zero value, an unknown
// bit, a truncated field and trailing bytes. Strings and Value are a uvarint length then
// the bytes, exactly as given (no re-encoding). Booleans are the bit alone.
const (
	fLease         = iota // 16 bytes
	fTTL                  // varint
	fName                 // string
	fClass                // 1 byte
	fHolderHost           // string
	fHolderPID            // uvarint
	fHolderNote           // string
	fWait                 // bit only
	fDelay                // varint
	fToken                // uvarint
	fCount                // uvarint
	fReason               // string
	fKey                  // string
	fValue                // bytes
	fVersion              // uvarint
	fCheckVersion         // bit only
	fRequireHolder        // bit only
	fNode                 // string
	fAddr                 // string
	fFastLane             // string
	fClusterID            // string
)

// The fields of lock modes and lock sets. They take bits 24 to 31 (bits 21 to 23 belong
// to other fields); a bit that names no field is rejected.
const (
	fMode  = 24 + iota // 1 byte
	fLimit             // uvarint
	fNames             // uvarint count (at least 1), then each name as a string
	numLockFields
)

// The fields of Watch and the ledger. They take bits 32 to 39.
const (
	fWallMillis = 32 + iota // varint: the proposer's wall clock, Unix ms
	numWatchFields
)

// The fields of groups (groups.go). They take bits 56 to 59.
const (
	fMember      = 56 + iota // string
	fPartition               // uvarint
	fWeight                  // uvarint
	fDrainMillis             // varint
	numFields
)

// knownFields has the bits of every field.
const knownFields = (1<<(fClusterID+1) - 1) | (1<<numLockFields-1)&^(1<<fMode-1) |
	(1<<numWatchFields-1)&^(1<<fWallMillis-1) | (1<<numFields-1)&^(1<<fMember-1)

const commandV2 = 2

// appendCommand appends c's version-2 encoding to b.
func appendCommand(b []byte, c Command) []byte {
	var mask uint64
	set := func(f int, present bool) {
		if present {
			mask |= 1 << f
		}
	}
	set(fLease, !c.Lease.IsZero())
	set(fTTL, c.TTLMillis != 0)
	set(fName, c.Name != "")
	set(fClass, c.Class != 0)
	set(fHolderHost, c.Holder.Host != "")
	set(fHolderPID, c.Holder.PID != 0)
	set(fHolderNote, c.Holder.Note != "")
	set(fWait, c.Wait)
	set(fDelay, c.DelayMillis != 0)
	set(fToken, c.Token != 0)
	set(fCount, c.Count != 0)
	set(fReason, c.Reason != "")
	set(fKey, c.Key != "")
	set(fValue, len(c.Value) != 0)
	set(fVersion, c.Version != 0)
	set(fCheckVersion, c.CheckVersion)
	set(fRequireHolder, c.RequireHolder)
	set(fNode, c.Node != "")
	set(fAddr, c.Addr != "")
	set(fFastLane, c.FastLane != "")
	set(fClusterID, c.ClusterID != "")
	set(fMode, c.Mode != 0)
	set(fLimit, c.Limit != 0)
	set(fNames, len(c.Names) != 0)
	set(fWallMillis, c.WallMillis != 0)
	set(fMember, c.Member != "")
	set(fPartition, c.Partition != 0)
	set(fWeight, c.Weight != 0)
	set(fDrainMillis, c.DrainMillis != 0)

	b = append(b, commandV2, byte(c.Op))
	b = binary.AppendUvarint(b, mask)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for f := range numFields {
		if mask&(1<<f) == 0 {
			continue
		}
		switch f {
		case fLease:
			b = append(b, c.Lease[:]...)
		case fTTL:
			b = binary.AppendVarint(b, c.TTLMillis)
		case fName:
			str(c.Name)
		case fClass:
			b = append(b, byte(c.Class))
		case fHolderHost:
			str(c.Holder.Host)
		case fHolderPID:
			b = binary.AppendUvarint(b, uint64(c.Holder.PID))
		case fHolderNote:
			str(c.Holder.Note)
		case fDelay:
			b = binary.AppendVarint(b, c.DelayMillis)
		case fToken:
			b = binary.AppendUvarint(b, c.Token)
		case fCount:
			b = binary.AppendUvarint(b, c.Count)
		case fReason:
			str(c.Reason)
		case fKey:
			str(c.Key)
		case fValue:
			b = binary.AppendUvarint(b, uint64(len(c.Value)))
			b = append(b, c.Value...)
		case fVersion:
			b = binary.AppendUvarint(b, c.Version)
		case fNode:
			str(c.Node)
		case fAddr:
			str(c.Addr)
		case fFastLane:
			str(c.FastLane)
		case fClusterID:
			str(c.ClusterID)
		case fMode:
			b = append(b, byte(c.Mode))
		case fLimit:
			b = binary.AppendUvarint(b, uint64(c.Limit))
		case fNames:
			b = binary.AppendUvarint(b, uint64(len(c.Names)))
			for _, n := range c.Names {
				str(n)
			}
		case fWallMillis:
			b = binary.AppendVarint(b, c.WallMillis)
		case fMember:
			str(c.Member)
		case fPartition:
			b = binary.AppendUvarint(b, uint64(c.Partition))
		case fWeight:
			b = binary.AppendUvarint(b, uint64(c.Weight))
		case fDrainMillis:
			b = binary.AppendVarint(b, c.DrainMillis)
		}
	}
	return b
}

// commandSize is an upper bound of c's encoded size, to allocate once.
func commandSize(c Command) int {
	n := 2 + 3 + 16 + 5*binary.MaxVarintLen64 + 1 + 8*binary.MaxVarintLen64
	n += len(c.Name) + len(c.Holder.Host) + len(c.Holder.Note) + len(c.Reason) + len(c.Key) + len(c.Value) + len(c.Node) + len(c.Addr) + len(c.FastLane) + len(c.ClusterID)
	if c.Mode != 0 || c.Limit != 0 || len(c.Names) != 0 {
		n += 1 + 1 + binary.MaxVarintLen32 + binary.MaxVarintLen64 // mask growth, mode, limit, count
	}
	for _, name := range c.Names {
		n += binary.MaxVarintLen64 + len(name)
	}
	if c.Member != "" || c.Partition != 0 || c.Weight != 0 || c.DrainMillis != 0 {
		n += 7 + binary.MaxVarintLen64 + len(c.Member) + 2*binary.MaxVarintLen32 + binary.MaxVarintLen64 // mask growth, member, partition, weight, drain
	}
	return n
}

// decodeCommandV2 decodes the body of a version-2 command (b without its version byte).
func decodeCommandV2(b []byte) (Command, error) {
	d := decoder{b: b}
	var c Command
	c.Op = Op(d.u8("op"))
	mask := d.uvarint("field mask")
	if unknown := mask &^ knownFields; d.err == nil && unknown != 0 {
		d.fail(fmt.Sprintf("unknown field %d", bits.TrailingZeros64(unknown)))
	}
	for f := range numFields {
		if d.err != nil {
			break
		}
		if mask&(1<<f) == 0 {
			continue
		}
		switch f {
		case fLease:
			copy(c.Lease[:], d.bytes("lease", len(c.Lease)))
			d.nonZero("lease", !c.Lease.IsZero())
		case fTTL:
			c.TTLMillis = d.varint("ttl")
			d.nonZero("ttl", c.TTLMillis != 0)
		case fName:
			c.Name = d.str("name")
		case fClass:
			c.Class = Class(d.u8("class"))
			d.nonZero("class", c.Class != 0)
		case fHolderHost:
			c.Holder.Host = d.str("holder host")
		case fHolderPID:
			c.Holder.PID = d.uint32("holder pid")
		case fHolderNote:
			c.Holder.Note = d.str("holder note")
		case fWait:
			c.Wait = true
		case fDelay:
			c.DelayMillis = d.varint("delay")
			d.nonZero("delay", c.DelayMillis != 0)
		case fToken:
			c.Token = d.uvarint("token")
			d.nonZero("token", c.Token != 0)
		case fCount:
			c.Count = d.uvarint("count")
			d.nonZero("count", c.Count != 0)
		case fReason:
			c.Reason = d.str("reason")
		case fKey:
			c.Key = d.str("key")
		case fValue:
			n := d.length("value")
			c.Value = append([]byte(nil), d.bytes("value", n)...)
			d.nonZero("value", n != 0)
		case fVersion:
			c.Version = d.uvarint("version")
			d.nonZero("version", c.Version != 0)
		case fCheckVersion:
			c.CheckVersion = true
		case fRequireHolder:
			c.RequireHolder = true
		case fNode:
			c.Node = d.str("node")
		case fAddr:
			c.Addr = d.str("addr")
		case fFastLane:
			c.FastLane = d.str("fast lane")
		case fClusterID:
			c.ClusterID = d.str("cluster id")
		case fMode:
			c.Mode = Mode(d.u8("mode"))
			d.nonZero("mode", c.Mode != 0)
		case fLimit:
			c.Limit = d.uint32("limit")
		case fNames:
			// Each name takes at least one byte (its length; an empty name is nothing
			// else), which bounds the count by the input.
			n := d.uvarint("names count")
			if n > uint64(len(d.b)) {
				d.fail("names truncated")
			}
			d.nonZero("names", n != 0)
			for range n {
				if d.err != nil {
					break
				}
				// Not d.str: an empty element is written as it is (the encoder keeps
				// every element, so that Names round-trips), and Apply refuses it.
				c.Names = append(c.Names, string(d.bytes("names", d.length("names"))))
			}
		case fWallMillis:
			c.WallMillis = d.varint("wall")
			d.nonZero("wall", c.WallMillis != 0)
		case fMember:
			c.Member = d.str("member")
		case fPartition:
			c.Partition = d.uint32("partition")
		case fWeight:
			c.Weight = d.uint32("weight")
		case fDrainMillis:
			c.DrainMillis = d.varint("drain")
			d.nonZero("drain", c.DrainMillis != 0)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return Command{}, d.err
	}
	return c, nil
}

// decoder reads a version-2 command; the first problem sticks in err (wrapping
// ErrCorrupt) and every later read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: command: %s", ErrCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) u8(field string) byte {
	if len(d.b) < 1 {
		d.fail(field + " truncated")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint(field string) uint64 { return readVarint(d, field, binary.Uvarint) }

// uint32 reads a uvarint that must fit 32 bits and be present (not zero).
func (d *decoder) uint32(field string) uint32 {
	v := d.uvarint(field)
	if v > 1<<32-1 {
		d.fail(field + " out of range")
	}
	d.nonZero(field, v != 0)
	return uint32(v)
}

func (d *decoder) varint(field string) int64 { return readVarint(d, field, binary.Varint) }

func readVarint[T uint64 | int64](d *decoder, field string, read func([]byte) (T, int)) T {
	v, n := read(d.b)
	if n <= 0 {
		d.fail(field + " is not a valid varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) length(field string) int {
	n := d.uvarint(field + " length")
	if n > uint64(len(d.b)) {
		d.fail(field + " truncated")
		return 0
	}
	return int(n)
}

func (d *decoder) bytes(field string, n int) []byte {
	if n > len(d.b) {
		d.fail(field + " truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) str(field string) string {
	n := d.length(field)
	s := string(d.bytes(field, n))
	d.nonZero(field, n != 0)
	return s
}

// nonZero rejects a field that is present but holds its zero value: the encoder never
// writes one, so such input was not written by EncodeCommand.
func (d *decoder) nonZero(field string, ok bool) {
	if !ok && d.err == nil {
		d.fail(field + " is present but zero")
	}
}
