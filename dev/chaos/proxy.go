package chaos

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// proxy is a TCP forwarder on loopback, standing in for the virtual IP or
// the proxy (HAProxy, ProxySQL, MaxScale) through which a production
// service reaches the primary of a MariaDB pair: go-sql-driver/mysql has
// no multi-host DSN. switchTo points new connections at another server
// and cuts the ones to the old, as a VIP moving does.
type proxy struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// newProxy listens on a free loopback port and forwards to target.
func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
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
		p.mu.Lock()
		target := p.target
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c, target)
	}
}

// forward copies between c and a new connection to target until either
// side ends or switchTo cuts c.
func (p *proxy) forward(c net.Conn, target string) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	s, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		return // the client sees the connection closed: refused, as by the server
	}
	defer s.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(s, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, s); done <- struct{}{} }()
	<-done
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

// close stops the proxy and every forwarded connection.
func (p *proxy) close() {
	p.ln.Close()
	p.switchTo("")
	p.wg.Wait()
}
