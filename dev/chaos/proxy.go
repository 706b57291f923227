package chaos

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is a TCP forwarder on loopback, standing in for the virtual IP or
// the proxy (HAProxy, ProxySQL, MaxScale) through which a production
// service reaches the primary of a MariaDB pair: go-sql-driver/mysql has
// no multi-host DSN. switchTo points new connections at another server
// and cuts the ones to the old, as a VIP moving does.
//
// freeze makes it a blackhole: nothing is forwarded in either direction,
// and no connection is closed (no RST, no FIN reaches either side), as when
// a network path drops every packet; new connections are accepted but get
// nowhere. heal forwards again what was held (TCP retransmits it once the
// path is back), and cut closes every connection instead, without
// forwarding what was held.
type proxy struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	conns  map[net.Conn]*link
	frozen bool
	thaw   chan struct{} // closed by heal and cut
	wg     sync.WaitGroup
	// armed, if set, is closed when the proxy froze after forwarding a
	// client's next write to the server (freezeAfterWrite).
	armed chan struct{}
}

// link is one forwarded connection: c from the client, s to the server
// (nil until dialled).
type link struct {
	c, s net.Conn
	dead atomic.Bool // cut: drop whatever is held
}

// newProxy listens on a free loopback port and forwards to target.
func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]*link{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l := &link{c: c}
		p.mu.Lock()
		p.conns[c] = l
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(l)
	}
}

// gate waits while the proxy is frozen.
func (p *proxy) gate() {
	p.mu.Lock()
	for p.frozen {
		ch := p.thaw
		p.mu.Unlock()
		<-ch
		p.mu.Lock()
	}
	p.mu.Unlock()
}

// forward copies between l.c and a new connection to the target until
// either side ends or switchTo or cut closes it.
func (p *proxy) forward(l *link) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, l.c)
		p.mu.Unlock()
		l.c.Close()
	}()
	p.gate() // a frozen path does not reach the server
	if l.dead.Load() {
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	s, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		return // the client sees the connection closed: refused, as by the server
	}
	defer s.Close()
	p.mu.Lock()
	l.s = s
	dead := l.dead.Load()
	p.mu.Unlock()
	if dead {
		return
	}
	done := make(chan struct{}, 2)
	go func() { p.pipe(l, s, l.c); done <- struct{}{} }()
	go func() { p.pipe(l, l.c, s); done <- struct{}{} }()
	<-done
}

// pipe copies from src to dst. What it reads while the proxy is frozen,
// and the end of src, are held until heal (and dropped by cut).
func (p *proxy) pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.gate()
		if l.dead.Load() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if dst != l.c {
				p.freezeIfArmed()
			}
		}
		if err != nil {
			return
		}
	}
}

// switchTo sends new connections to target and closes every current one.
func (p *proxy) switchTo(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
}

// freeze stops forwarding (see proxy).
func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen {
		p.frozen, p.thaw = true, make(chan struct{})
	}
}

// freezeAfterWrite arms the proxy to freeze right after it forwarded the
// next write of any client to the server: that statement reaches the
// server, and its answer is held. The returned channel is closed when it
// froze; disarm undoes an armed freeze that has not happened.
func (p *proxy) freezeAfterWrite() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan struct{})
	p.armed = ch
	return ch
}

func (p *proxy) disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = nil
}

func (p *proxy) freezeIfArmed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == nil {
		return
	}
	if !p.frozen {
		p.frozen, p.thaw = true, make(chan struct{})
	}
	close(p.armed)
	p.armed = nil
}

// heal forwards again, starting with what was held.
func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		p.frozen = false
		close(p.thaw)
	}
}

// cut closes every connection on both sides, dropping what was held, and
// forwards new connections again.
func (p *proxy) cut() {
	p.mu.Lock()
	for _, l := range p.conns {
		l.dead.Store(true)
		l.c.Close()
		if l.s != nil {
			l.s.Close()
		}
	}
	p.mu.Unlock()
	p.heal()
}

// close stops the proxy and every forwarded connection.
func (p *proxy) close() {
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// Proxy is a TCP forwarder on loopback that tests put between a client and
// its server to take the path away: Freeze drops everything (a blackhole:
// no RST, no FIN, as a network partition or a dead switch does), Heal
// brings it back, Cut closes every connection.
type Proxy struct{ p *proxy }

// NewProxy listens on a free loopback port and forwards to target
// (host:port).
func NewProxy(target string) (*Proxy, error) {
	p, err := newProxy(target)
	if err != nil {
		return nil, err
	}
	return &Proxy{p: p}, nil
}

// Addr is the proxy's address (host:port), to give the client.
func (p *Proxy) Addr() string { return p.p.addr() }

// Freeze stops forwarding in both directions without closing anything; new
// connections are accepted but reach nothing.
func (p *Proxy) Freeze() { p.p.freeze() }

// Heal forwards again, first what was held while frozen.
func (p *Proxy) Heal() { p.p.heal() }

// Cut closes every connection on both sides without forwarding what was
// held, and forwards new connections again.
func (p *Proxy) Cut() { p.p.cut() }

// Close stops the proxy and every connection through it.
func (p *Proxy) Close() { p.p.close() }

// serverPorts returns the local ports of the connections the proxy holds to
// its target: the client ports the server sees.
func (p *proxy) serverPorts() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ports []int
	for _, l := range p.conns {
		if l.s == nil {
			continue
		}
		if a, ok := l.s.LocalAddr().(*net.TCPAddr); ok {
			ports = append(ports, a.Port)
		}
	}
	return ports
}
