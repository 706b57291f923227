package mysql

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gorm.io/gorm"
)

// Server is what [DetectServer] found out about the server.
type Server struct {
	MariaDB      bool
	Major, Minor int
	Version      string // as SELECT VERSION() reports it
}

// Supported reports whether the Store supports the server: MySQL 8.0 or
// later, MariaDB 10.5 or later.
func (v Server) Supported() bool {
	if v.MariaDB {
		return v.Major > 10 || v.Major == 10 && v.Minor >= 5
	}
	return v.Major >= 8
}

func (v Server) String() string {
	if v.MariaDB {
		return "MariaDB " + v.Version
	}
	return "MySQL " + v.Version
}

// DetectServer asks the server behind db for its product and version.
func DetectServer(ctx context.Context, db *gorm.DB) (Server, error) {
	var version string
	if err := db.WithContext(ctx).Raw("SELECT VERSION()").Row().Scan(&version); err != nil {
		return Server{}, fmt.Errorf("mysql: read the server version: %w", err)
	}
	return parseVersion(version), nil
}

func parseVersion(version string) Server {
	v := Server{Version: version, MariaDB: strings.Contains(strings.ToLower(version), "mariadb")}
	nums := strings.SplitN(strings.SplitN(version, "-", 2)[0], ".", 3)
	if len(nums) >= 2 {
		v.Major, _ = strconv.Atoi(nums[0])
		v.Minor, _ = strconv.Atoi(nums[1])
	}
	return v
}

// Verify checks the server version, that the session's sql_mode is strict
// (a value too long for its column is an error, not silently cut), and that
// the inbox table is InnoDB, stores consumer and event id as binary strings,
// and is partitioned by LIST COLUMNS(day), one day per partition; and,
// if the watermark table exists, its layout (see MigrateWatermarks;
// without one, sequenced dedup is not in use, which is no problem).
func (s *Store) Verify(ctx context.Context, db *gorm.DB) error {
	db = db.WithContext(ctx)
	server, problems, err := sessionProblems(ctx, db)
	if err != nil {
		return err
	}
	if !server.Supported() {
		problems = append(problems, fmt.Errorf("server %s is not supported (MySQL 8.0+ or MariaDB 10.5+)", server))
	}
	if err := s.checkEngine(db); err != nil {
		problems = append(problems, err)
	}
	if _, err := s.listLayout(db); err != nil {
		problems = append(problems, err)
	}
	if s.wm.err == nil {
		if err := s.checkWatermarkLayout(db, false); err != nil {
			problems = append(problems, err)
		}
	}
	rows, err := db.Raw(`SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`, nullIfEmpty(s.schema), s.name).Rows()
	if err != nil {
		return fmt.Errorf("mysql: read the columns of %s: %w", s.name, err)
	}
	defer rows.Close()
	missing := map[string]bool{"consumer": true, "event_id": true, "day": true, "event_time": true, "topic": true,
		"partition_no": true, "offset_no": true, "claim_token": true, "deliveries": true, "processed_at": true}
	for rows.Next() {
		var col, typ string
		if err := rows.Scan(&col, &typ); err != nil {
			return fmt.Errorf("mysql: read the columns of %s: %w", s.name, err)
		}
		delete(missing, strings.ToLower(col))
		if (strings.EqualFold(col, "consumer") || strings.EqualFold(col, "event_id")) && !strings.EqualFold(typ, "varbinary") {
			problems = append(problems, fmt.Errorf("column %s.%s is %s, not VARBINARY: ids that differ in case or trailing spaces could collide", s.name, col, typ))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("mysql: read the columns of %s: %w", s.name, err)
	}
	if len(missing) > 0 && len(missing) < 10 {
		var cols []string
		for c := range missing {
			cols = append(cols, c)
		}
		slices.Sort(cols)
		problems = append(problems, fmt.Errorf("table %s lacks the columns %s (run Migrate)", s.name, strings.Join(cols, ", ")))
	}
	if len(problems) > 0 {
		return fmt.Errorf("mysql: unsafe settings on %s: %w", server, errors.Join(problems...))
	}
	return nil
}

// sessionProblems detects the server and reports a session sql_mode that is
// not strict: a value too long for its column would be cut with only a
// warning.
func sessionProblems(ctx context.Context, db *gorm.DB) (Server, []error, error) {
	server, err := DetectServer(ctx, db)
	if err != nil {
		return server, nil, err
	}
	var mode string
	// No bind arguments: GORM would read @@ as a named parameter.
	if err := db.Raw("SELECT @@SESSION.sql_mode").Row().Scan(&mode); err != nil {
		return server, nil, fmt.Errorf("mysql: read sql_mode: %w", err)
	}
	var problems []error
	if !strictMode(mode) {
		problems = append(problems, fmt.Errorf("sql_mode %q has neither STRICT_TRANS_TABLES nor STRICT_ALL_TABLES: too long values are cut with only a warning (open with mysql.Open or mysql.StrictDSN)", mode))
	}
	return server, problems, nil
}

func strictMode(mode string) bool {
	for _, m := range strings.Split(strings.ToUpper(mode), ",") {
		if m == "STRICT_TRANS_TABLES" || m == "STRICT_ALL_TABLES" {
			return true
		}
	}
	return false
}
