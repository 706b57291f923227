package consumer

// The fingerprint of the message before a stored offset, which the stored
// offset carries.

import (
	"encoding/binary"
	"hash/crc32"
	"hash/fnv"

	"github.com/segmentio/kafka-go"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fingerprint identifies a message by its content (key, timestamp, headers
// and value), never by its position, so that the message at an offset of a
// recreated topic differs from the one the group processed at that offset
// before. The value counts through its length and CRC-32C (hardware
// accelerated), the rest is hashed with FNV-1a; each field is length
// prefixed. Never 0, which stands for "unknown".
func fingerprint(m *kafka.Message) int64 {
	h := fnv.New64a()
	var n [8]byte
	num := func(v uint64) {
		binary.BigEndian.PutUint64(n[:], v)
		h.Write(n[:])
	}
	bytes := func(b []byte) {
		num(uint64(len(b)))
		h.Write(b)
	}
	bytes(m.Key)
	num(uint64(m.Time.UnixMilli()))
	num(uint64(len(m.Headers)))
	for _, hd := range m.Headers {
		bytes([]byte(hd.Key))
		bytes(hd.Value)
	}
	num(uint64(len(m.Value))<<32 | uint64(crc32.Checksum(m.Value, castagnoli)))
	if f := int64(h.Sum64()); f != 0 {
		return f
	}
	return 1
}

// lastOf is the fingerprint of the message at next - 1 if it is one of the
// current batch, or 0.
func (b *batchRunner) lastOf(next int64) int64 {
	for _, it := range b.batch {
		if it.msg.Offset == next-1 {
			return fingerprint(&it.msg.Message)
		}
	}
	return 0
}
