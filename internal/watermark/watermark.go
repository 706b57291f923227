// Package watermark encodes what a sequenced stream has applied: the
// highest sequence number per shard of the source, as the opaque value a
// storage.WatermarkStore keeps.
//
// The encoding is canonical (one byte string per value), because the
// store's compare-and-set compares the bytes: shards in ascending order,
// each as the uvarint of its distance from the previous shard (the first
// from -1), followed by the uvarint of its sequence number.
package watermark

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Applied maps a shard to the highest sequence number applied in it.
type Applied map[int32]int64

// Encode returns the canonical encoding of a. Shards must be non-negative
// and sequence numbers positive; Encode skips any other entry.
func Encode(a Applied) []byte {
	shards := slices.Sorted(maps.Keys(a))
	b := make([]byte, 0, 4*len(shards))
	prev := int64(-1)
	for _, sh := range shards {
		seq := a[sh]
		if sh < 0 || seq <= 0 {
			continue
		}
		b = binary.AppendUvarint(b, uint64(int64(sh)-prev))
		b = binary.AppendUvarint(b, uint64(seq))
		prev = int64(sh)
	}
	return b
}

// Decode is the inverse of Encode. It refuses any byte string Encode
// would not have made.
func Decode(stored []byte) (Applied, error) {
	a := Applied{}
	b := stored
	prev := int64(-1)
	for len(b) > 0 {
		d, n := binary.Uvarint(b)
		if n <= 0 || d == 0 {
			return nil, errBad("shard")
		}
		b = b[n:]
		seq, n := binary.Uvarint(b)
		if n <= 0 || seq == 0 || seq > 1<<63-1 {
			return nil, errBad("sequence number")
		}
		b = b[n:]
		sh := prev + int64(d)
		if sh > 1<<31-1 {
			return nil, errBad("shard")
		}
		a[int32(sh)] = int64(seq)
		prev = sh
	}
	// Varints with redundant bytes decode to the same value but would
	// never compare equal to what Encode writes for it.
	if !bytes.Equal(Encode(a), stored) {
		return nil, errors.New("watermark: the stored value is not in canonical form")
	}
	return a, nil
}

func errBad(what string) error {
	return fmt.Errorf("watermark: bad %s in the stored value", what)
}
