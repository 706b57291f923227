package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
)

// A process stopped with SIGSTOP may be inside a database transaction or
// between two. Which one is told by the server: the process's TCP
// connections are found by their local ports (its sockets in /proc, Linux
// only), and the server lists the open transactions of the sessions whose
// client ports those are.

// localPorts returns the local TCP ports of process pid's sockets.
func localPorts(pid int) ([]int, error) {
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "net", table))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st queues tr retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			if port, err := strconv.ParseInt(hexPort, 16, 32); err == nil {
				ports = append(ports, int(port))
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// trxRefresh is longer than InnoDB's 100 ms between two refreshes of what
// INNODB_TRX shows (TRX_I_S_CACHE_MIN_REFRESH_TIME).
const trxRefresh = 120 * time.Millisecond

// errNoServer: SQLite has no server that could list a process's
// transactions.
var errNoServer = errors.New("chaos: no database server to ask")

// openTransactions returns how many sessions of the run's processes whose
// client ports are among ports have a transaction open (PostgreSQL: in a
// transaction block, or running a statement; MariaDB: an InnoDB transaction
// started), asked through db.
func (a *pgAdmin) openTransactions(ctx context.Context, db *gorm.DB, ports []int) (int, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	var n int
	err := db.WithContext(ctx).Raw(`SELECT count(*) FROM pg_stat_activity
		WHERE application_name = ? AND client_port IN ? AND xact_start IS NOT NULL`, a.app, ports).Scan(&n).Error
	return n, err
}

func (a *mysqlAdmin) openTransactions(ctx context.Context, db *gorm.DB, ports []int) (int, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	hosts := make([]string, 0, 2*len(ports))
	for _, p := range ports {
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", p), fmt.Sprintf("localhost:%d", p))
	}
	a.trxMu.Lock()
	defer a.trxMu.Unlock()
	if wait := time.Until(a.trxRead.Add(trxRefresh)); wait > 0 {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(wait):
		}
	}
	defer func() { a.trxRead = time.Now() }()
	var n int
	err := db.WithContext(ctx).Raw("SELECT count(*) FROM information_schema.INNODB_TRX t "+
		"JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id WHERE p.USER = ? AND p.HOST IN ?", a.user, hosts).Scan(&n).Error
	return n, err
}

func (noAdmin) openTransactions(context.Context, *gorm.DB, []int) (int, error) { return 0, errNoServer }

// inTransaction reports how many transactions process pid holds open on
// the run's database server.
func (r *run) inTransaction(ctx context.Context, pid int) (int, error) {
	ports, err := localPorts(pid)
	if err != nil {
		return 0, err
	}
	return r.admin.openTransactions(ctx, r.db, ports)
}
