// Package atonce starts work at the same instant, for tests of races that
// only show when callers start together: several goroutines (Calls), or
// several processes of the test binary (Processes, with Ready in the child
// test), as replicas of a deployment starting together do. Adapter tests use
// it to prove that Migrate is safe with concurrent callers.
package atonce

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// Calls runs fns, each in a goroutine of its own, released together once
// all have started, and returns their errors.
func Calls(fns ...func() error) error {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, len(fns))
	for i, fn := range fns {
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-start
			errs[i] = fn()
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	return errors.Join(errs...)
}

// Processes runs n processes of this test binary that run only the
// test child, with env added; each prepares, says so (Ready), and all
// are released together. It returns the output of each that failed.
func Processes(t *testing.T, n int, child string, env ...string) error {
	t.Helper()
	type proc struct {
		cmd     *exec.Cmd
		release *os.File
		lines   *bufio.Scanner
		out     lockedBuffer // its stderr (written by exec's copier) and its stdout lines
	}
	procs := make([]*proc, n)
	for i := range procs {
		p := &proc{cmd: exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^"+child+"$", "-test.count=1", "-test.v")}
		p.cmd.Env = append(os.Environ(), env...)
		p.cmd.Stderr = &p.out
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		p.cmd.Stdin, p.release = r, w
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		p.lines = bufio.NewScanner(stdout)
		procs[i] = p
	}
	for _, p := range procs {
		for p.lines.Scan() && p.lines.Text() != startLine {
			fmt.Fprintln(&p.out, p.lines.Text())
		}
	}
	for _, p := range procs {
		p.release.Close() // releases it: Ready reads EOF
	}
	var errs []error
	for i, p := range procs {
		for p.lines.Scan() {
			fmt.Fprintln(&p.out, p.lines.Text())
		}
		if err := p.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("process %d: %w:\n%s", i+1, err, p.out.String()))
		}
	}
	return errors.Join(errs...)
}

const startLine = "ready to start"

// lockedBuffer collects a process's output from two goroutines: exec's
// copier of its stderr and Processes, which reads its stdout.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Ready tells Processes that this process is ready, and waits
// until it releases every process together.
func Ready() {
	fmt.Println(startLine)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}
