package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/inboxgo/inbox/dev/inventory"
	"github.com/inboxgo/inbox/internal/backoff"
)

// fleet keeps Config.Consumers consumer processes running: it kills them on
// request, starts replacements, and replaces a process that exited on its
// own or reported a stopped partition (each recorded as a finding).
type fleet struct {
	r        *run
	eventLog string

	errors *errorLog

	mu       sync.Mutex
	procs    []*proc
	started  int
	lastExit time.Time
	wg       sync.WaitGroup

	// prepare, if set, adjusts each process's configuration before it
	// starts, and may give it a database link of its own (closed once the
	// process ended).
	prepare func(p *proc, pc *inventory.ProcessConfig) error
	marks   *markLog // nil: none counted
}

type proc struct {
	name  string
	cmd   *exec.Cmd
	out   *watcher
	done  chan struct{}
	link  *proxy // the process's own way to the database, if prepare gave it one
	trace string // its trace file, if prepare asked for one
}

func newFleet(r *run) *fleet {
	return &fleet{r: r, eventLog: filepath.Join(r.cfg.WorkDir, "events.log"), errors: &errorLog{kinds: map[string]*errorKind{}}}
}

// start starts one consumer process.
func (f *fleet) start(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.startLocked(ctx)
}

func (f *fleet) startLocked(ctx context.Context) error {
	f.started++
	name := fmt.Sprintf("consumer-%d", f.started)
	logFile, err := os.OpenFile(filepath.Join(f.r.cfg.WorkDir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	w := &watcher{file: logFile, errors: f.errors, marks: f.marks}
	cfg := f.r.cfg
	pc := inventory.ProcessConfig{
		Backend: f.r.backend, Brokers: cfg.Brokers, Topic: f.r.topic, Group: f.r.group, Name: name,
		EventLog: f.eventLog, Session: cfg.Session, BatchSize: cfg.BatchSize, StoreOffsets: cfg.StoreOffsets,
		DeadLetterTopic: f.r.dlq,
	}
	p := &proc{name: name, out: w, done: make(chan struct{})}
	if f.prepare != nil {
		if err := f.prepare(p, &pc); err != nil {
			logFile.Close()
			return err
		}
	}
	// The process is not bound to ctx: it is always ended by the fleet.
	cmd, err := inventory.StartProcess(context.WithoutCancel(ctx), pc, w)
	if err != nil {
		logFile.Close()
		if p.link != nil {
			p.link.close()
		}
		return err
	}
	p.cmd = cmd
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		_ = cmd.Wait()
		logFile.Close()
		if p.link != nil {
			p.link.close()
		}
		close(p.done)
	}()
	f.procs = append(f.procs, p)
	if f.started > cfg.Consumers {
		f.r.mu.Lock()
		f.r.rep.Replacements++
		f.r.mu.Unlock()
	}
	return nil
}

// killRandom sends SIGKILL to a random running consumer, reaps it and starts
// a replacement.
func (f *fleet) killRandom(ctx context.Context, busy bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.procs) == 0 {
		return f.startLocked(ctx)
	}
	i := f.r.intn(len(f.procs))
	p := f.procs[i]
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	if err := reap(p, 30*time.Second); err != nil {
		return err
	}
	f.procs = append(f.procs[:i], f.procs[i+1:]...)
	f.r.mu.Lock()
	f.r.rep.Kills++
	if busy {
		f.r.rep.BusyKills++
	}
	kills := f.r.rep.Kills
	f.r.mu.Unlock()
	state := "idle"
	if busy {
		state = "applying effects"
	}
	f.r.say("SIGKILL %s (kill #%d, consumers %s)", p.name, kills, state)
	return f.startLocked(ctx)
}

// supervise replaces, until ctx ends, every consumer that exited on its own
// or reported a stopped partition.
func (f *fleet) supervise(ctx context.Context) {
	for {
		f.mu.Lock()
		for i := 0; i < len(f.procs); i++ {
			p := f.procs[i]
			var finding string
			select {
			case <-p.done:
				if time.Since(f.lastExit) < time.Second {
					continue // at most one replacement a second while processes keep exiting (a database down)
				}
				f.lastExit = time.Now()
				finding = fmt.Sprintf("%s exited on its own (%v): %s", p.name, p.cmd.ProcessState, p.out.tail())
			default:
				if line := p.out.stopped(); line != "" {
					finding = fmt.Sprintf("%s stopped a partition: %s", p.name, line)
					_ = p.cmd.Process.Signal(syscall.SIGKILL)
					_ = reap(p, 30*time.Second)
				}
			}
			if finding == "" {
				continue
			}
			f.r.say("FINDING: %s; replacing it", finding)
			f.r.mu.Lock()
			f.r.rep.Findings = append(f.r.rep.Findings, finding)
			f.r.rep.StoppedConsumers++
			f.r.mu.Unlock()
			f.procs = append(f.procs[:i], f.procs[i+1:]...)
			i--
			if err := f.startLocked(ctx); err != nil {
				f.r.say("cannot start a replacement: %v", err)
			}
		}
		f.mu.Unlock()
		if backoff.Sleep(ctx, 200*time.Millisecond) != nil {
			return
		}
	}
}

// stopAll asks every consumer to stop (SIGTERM), kills those that do not
// within 30 s, and reaps them all. It is safe to call more than once.
func (f *fleet) stopAll() {
	f.mu.Lock()
	procs := f.procs
	f.procs = nil
	f.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		if reap(p, 30*time.Second) != nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			_ = reap(p, 30*time.Second)
		}
	}
	f.wg.Wait()
}

func reap(p *proc, timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("chaos: %s (pid %d) did not end within %v", p.name, p.cmd.Process.Pid, timeout)
	}
}

// watcher keeps a consumer's output in its log file and notes the lines
// that report a stopped partition.
type watcher struct {
	mu      sync.Mutex
	file    *os.File
	errors  *errorLog
	marks   *markLog // nil: none counted
	partial []byte
	last    []string
	stop    string
	seen    bool
	// injected: the process announced that it kills itself on purpose
	// (inventory.InjectedCrash); its exit is no finding.
	injected bool
}

func (w *watcher) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.file.Write(b)
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		line := string(w.partial[:i])
		w.partial = w.partial[i+1:]
		if strings.Contains(line, "level=ERROR") {
			w.errors.add(line)
		}
		if w.marks != nil {
			w.marks.add(line)
		}
		if strings.Contains(line, inventory.InjectedCrash) {
			w.injected = true
		}
		if strings.Contains(line, "PARTITION STOPPED") && w.stop == "" {
			w.stop = line
		}
		w.last = append(w.last, line)
		if len(w.last) > 5 {
			w.last = w.last[1:]
		}
	}
	return len(b), nil
}

// stopped returns the first line that reported a stopped partition, once.
func (w *watcher) stopped() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop == "" || w.seen {
		return ""
	}
	w.seen = true
	return w.stop
}

func (w *watcher) crashedOnPurpose() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.injected
}

func (w *watcher) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.last, " | ")
}

// Lines a member logs when it loses its partitions or its leases, or
// leaves its group (markLog counts them by level).
const (
	markFenced        = "partition taken over by a newer generation"
	markLeaseLost     = "another relay took over shards"
	markStalled       = "PARTITION STALLED"
	markMessageFailed = "message failed"
	// The relay of an aligned outbox found numbers it was about to publish
	// already published (rewind.go), or could not check them all.
	markWentBack  = "the outbox's database went back"
	markRetention = "retention deleted messages of the partition"
)

var markPatterns = []string{markFenced, markLeaseLost, markStalled, markMessageFailed, markWentBack, markRetention}

// markLog counts the processes' lines that contain one of markPatterns,
// by level: "WARN partition taken over ...".
type markLog struct {
	mu sync.Mutex
	n  map[string]int
}

func newMarkLog() *markLog { return &markLog{n: map[string]int{}} }

var levelField = regexp.MustCompile(`level=(\S+)`)

func (m *markLog) add(line string) {
	for _, p := range markPatterns {
		if !strings.Contains(line, p) {
			continue
		}
		level := ""
		if m := levelField.FindStringSubmatch(line); m != nil {
			level = m[1]
		}
		key := level + " " + p
		m.mu.Lock()
		m.n[key]++
		m.mu.Unlock()
	}
}

// count returns the lines of pattern at level ("ERROR", "WARN", "INFO";
// "" for every level).
func (m *markLog) count(level, pattern string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, v := range m.n {
		l, p, _ := strings.Cut(k, " ")
		if p == pattern && (level == "" || l == level) {
			n += v
		}
	}
	return n
}

// summary lists the counts, sorted.
func (m *markLog) summary() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k, v := range m.n {
		out = append(out, fmt.Sprintf("%dx %s", v, k))
	}
	slices.Sort(out)
	return out
}

// errorLog counts the consumers' ERROR lines by message and error text.
type errorLog struct {
	mu    sync.Mutex
	lines int
	kinds map[string]*errorKind
	order []string
}

type errorKind struct {
	n       int
	example string
}

var (
	msgField   = regexp.MustCompile(`msg="([^"]*)"|msg=(\S+)`)
	errorField = regexp.MustCompile(`error="((?:[^"\\]|\\.)*)"|error=(\S+)`)
	digits     = regexp.MustCompile(`[0-9]{4,}`) // ids, ports, offsets; not SQLSTATEs
)

func (e *errorLog) add(line string) {
	key := field(msgField, line)
	if er := field(errorField, line); er != "" {
		key += ": " + digits.ReplaceAllString(er, "N")
	}
	if len(key) > 300 {
		key = key[:300]
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lines++
	k, ok := e.kinds[key]
	if !ok {
		k = &errorKind{example: line}
		e.kinds[key] = k
		e.order = append(e.order, key)
	}
	k.n++
}

func field(re *regexp.Regexp, line string) string {
	m := re.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	if m[1] != "" {
		return m[1]
	}
	return m[2]
}

// summary returns the number of lines and the distinct kinds, most frequent
// first, at most 12.
func (e *errorLog) summary() (int, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	keys := slices.Clone(e.order)
	slices.SortStableFunc(keys, func(a, b string) int { return e.kinds[b].n - e.kinds[a].n })
	var out []string
	for i, k := range keys {
		if i == 12 {
			out = append(out, fmt.Sprintf("... and %d more kinds", len(keys)-12))
			break
		}
		out = append(out, fmt.Sprintf("%dx %s", e.kinds[k].n, k))
	}
	return e.lines, out
}
