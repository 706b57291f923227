package watermark

import (
	"bytes"
	"testing"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, a := range []Applied{{}, {0: 1}, {5: 7, 0: 3, 63: 1 << 40}, {1<<31 - 1: 1<<63 - 1}} {
		b := Encode(a)
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%v)): %v", a, err)
		}
		if len(got) != len(a) {
			t.Fatalf("Decode(Encode(%v)) = %v", a, got)
		}
		for sh, seq := range a {
			if got[sh] != seq {
				t.Fatalf("Decode(Encode(%v)) = %v", a, got)
			}
		}
	}
}

func TestEncodeIsCanonical(t *testing.T) {
	a := Applied{}
	b := Applied{}
	for sh := int32(0); sh < 64; sh++ {
		a[sh] = int64(sh) + 1
	}
	for sh := int32(63); sh >= 0; sh-- {
		b[sh] = int64(sh) + 1
	}
	if !bytes.Equal(Encode(a), Encode(b)) {
		t.Fatal("the same value encoded differently")
	}
}

func TestDecodeRefusesWhatEncodeNeverWrites(t *testing.T) {
	for name, b := range map[string][]byte{
		"truncated":      {1},
		"zero distance":  {1, 1, 0, 1},
		"zero sequence":  {1, 0},
		"redundant byte": {0x81, 0x00, 1},
		"huge shard":     {0xff, 0xff, 0xff, 0xff, 0x0f, 1},
	} {
		if a, err := Decode(b); err == nil {
			t.Errorf("%s: Decode(%x) = %v, want an error", name, b, a)
		}
	}
}
