package mysql_test

import (
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
)

// openDB opens dsn the way the adapter recommends (inboxmysql.Open).
func openDB(dsn string) (*gorm.DB, error) {
	d, err := inboxmysql.Open(dsn)
	if err != nil {
		return nil, err
	}
	return gorm.Open(d, &gorm.Config{Logger: logger.Discard})
}
