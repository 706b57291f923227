// Package scripts_test checks the parts of the service scripts that can run
// without starting a server.
package scripts_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// clusterID runs `kafka.sh cluster-id [source]` and returns the id it prints.
func clusterID(t *testing.T, source string) string {
	t.Helper()
	args := []string{"kafka.sh", "cluster-id"}
	if source != "" {
		args = append(args, source)
	}
	cmd := exec.Command("bash", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kafka.sh cluster-id %s: %v\n%s", source, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// checkClusterID fails unless id is what `kafka-storage format -t` accepts
// and Kafka's Uuid.randomUuid could have made: 16 bytes in URL-safe base64
// without padding, not starting with '-' (the tool would read it as an
// option: "expected one argument"), and not one of Kafka's reserved ids.
func checkClusterID(t *testing.T, id string) {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(id)
	switch {
	case err != nil || len(raw) != 16:
		t.Errorf("cluster id %q is not 16 bytes of URL-safe base64 (%d bytes, %v)", id, len(raw), err)
	case strings.HasPrefix(id, "-"):
		t.Errorf("cluster id %q starts with '-': kafka-storage format -t would take it for an option", id)
	case id == reservedZero || id == reservedOne:
		t.Errorf("cluster id %q is reserved by Kafka", id)
	}
}

// Kafka's Uuid.ZERO_UUID and Uuid.ONE_UUID (the metadata topic's id).
var (
	reservedZero = base64.RawURLEncoding.EncodeToString(make([]byte, 16))
	reservedOne  = base64.RawURLEncoding.EncodeToString(append(make([]byte, 15), 1))
)

// TestKafkaClusterIDIsSafe feeds kafka.sh's id generator 16-byte draws whose
// encoding starts with '-' (one random draw in 64 does: a first byte of
// 0xF8..0xFB) or that Kafka reserves, each followed by a usable draw, and
// checks that it draws again, as Kafka's Uuid.randomUuid does, and returns
// the usable one. Then it checks ids drawn from /dev/urandom.
func TestKafkaClusterIDIsSafe(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	var bad [][]byte
	for i := range 48 {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		b[0] = 0xF8 | byte(i&3)
		bad = append(bad, b)
	}
	bad = append(bad, make([]byte, 16), append(make([]byte, 15), 1))
	for i, first := range bad {
		good := make([]byte, 16)
		_, _ = rand.Read(good)
		good[0] = 0x40 | good[0]&0x3F // encodes to 'Q'..'f': never '-'
		src := filepath.Join(dir, "draws")
		// Draws after the usable one would be bad too: the generator must
		// stop at the first usable draw.
		if err := os.WriteFile(src, bytes.Join([][]byte{first, good, first}, nil), 0o600); err != nil {
			t.Fatal(err)
		}
		id := clusterID(t, src)
		checkClusterID(t, id)
		if want := base64.RawURLEncoding.EncodeToString(good); id != want {
			t.Errorf("draw %d (%x): cluster id %q, want the next usable draw %q", i, first, id, want)
		}
	}
	for range 64 {
		checkClusterID(t, clusterID(t, ""))
	}
}

// TestKafkaClusterIDFailsOnShortSource checks that a source that runs out of
// bytes is an error, not a short or empty id.
func TestKafkaClusterIDFailsOnShortSource(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	src := filepath.Join(t.TempDir(), "draws")
	first := make([]byte, 16)
	first[0] = 0xF8 // unusable: the generator needs a second draw
	if err := os.WriteFile(src, append(first, 1, 2, 3), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "kafka.sh", "cluster-id", src).Output()
	if err == nil {
		t.Errorf("kafka.sh cluster-id with 19 bytes of source succeeded: %q", out)
	}
}

// TestPostgresMultiDSN checks the DSN a replicated pair's consumers use:
// both servers' ports in order, read-write sessions only. It refuses a dir
// that holds no server of postgres.sh.
func TestPostgresMultiDSN(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	var dirs []string
	for _, port := range []string{"15432", "15433"} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, ".inbox-postgres"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		dsn := "host=127.0.0.1 port=" + port + " user=postgres dbname=inbox_test sslmode=disable\n"
		if err := os.WriteFile(filepath.Join(d, "dsn"), []byte(dsn), 0o600); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	out, err := exec.Command("bash", append([]string{"postgres.sh", "multi-dsn"}, dirs...)...).Output()
	if err != nil {
		t.Fatalf("postgres.sh multi-dsn: %v", err)
	}
	got := strings.TrimSpace(string(out))
	for _, want := range []string{"host=127.0.0.1,127.0.0.1 ", "port=15432,15433 ", "target_session_attrs=read-write", "dbname=inbox_test"} {
		if !strings.Contains(got, want) {
			t.Errorf("multi-dsn = %q, lacks %q", got, want)
		}
	}
	if out, err := exec.Command("bash", "postgres.sh", "multi-dsn", t.TempDir()).CombinedOutput(); err == nil {
		t.Errorf("multi-dsn of a foreign dir succeeded: %s", out)
	}
}
