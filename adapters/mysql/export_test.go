package mysql

import "database/sql"

// OwnedPools returns the pools with autocommit off that s has opened, by
// DSN and isolation level.
func OwnedPools(s *Store) map[string]*sql.DB {
	s.owned.mu.Lock()
	defer s.owned.mu.Unlock()
	out := make(map[string]*sql.DB, len(s.owned.pools))
	for k, p := range s.owned.pools {
		out[k.dsn+"|"+k.level.String()] = p
	}
	return out
}
