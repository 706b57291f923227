package mysql_test

import (
	"errors"
	"fmt"
	"log"

	inboxmysql "github.com/inboxgo/inbox/adapters/mysql"
	"github.com/inboxgo/inbox/storage"
)

// Open adds to the application's DSN what the inbox relies on: a strict
// sql_mode on every connection, so that a value too long for its column is
// an error rather than a silently truncated event id, and client-side
// interpolation, which saves two round trips per statement. StrictDSN
// shows the DSN Open uses; a DSN that sets sql_mode itself keeps it.
func ExampleStrictDSN() {
	dsn, err := inboxmysql.StrictDSN("app:secret@tcp(db.internal:3306)/shop?parseTime=true")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dsn)
	// Output:
	// app:secret@tcp(db.internal:3306)/shop?interpolateParams=true&parseTime=true&sql_mode=CONCAT%28%40%40sql_mode%2C%27%2CSTRICT_TRANS_TABLES%27%29
}

// Open makes a GORM dialector without connecting: a malformed DSN is
// refused here, wrapping storage.ErrInvalidConfig; gorm.Open is the first to
// reach the server (see Example).
func ExampleOpen() {
	dialector, err := inboxmysql.Open("app:secret@tcp(db.internal:3306)/shop?parseTime=true")
	fmt.Println(dialector.Name(), err)

	_, err = inboxmysql.Open("app:secret@tcp(db.internal:3306/shop")
	fmt.Println(err)
	fmt.Println(errors.Is(err, storage.ErrInvalidConfig))
	// Output:
	// mysql <nil>
	// inbox: invalid configuration: mysql DSN: invalid DSN: network address not terminated (missing closing brace)
	// true
}

// New checks the options and touches no database. Schema names the
// database holding the table (empty: the connection's current one); a
// qualified name in Table is refused, as is anything but a plain
// identifier, wrapping storage.ErrInvalidConfig.
func ExampleNew() {
	store, err := inboxmysql.New(inboxmysql.Options{Schema: "billing", Table: "inbox_messages"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(store.Table())

	_, err = inboxmysql.New(inboxmysql.Options{Table: "billing.inbox_messages"})
	fmt.Println(err)
	fmt.Println(errors.Is(err, storage.ErrInvalidConfig))
	// Output:
	// inbox_messages
	// inbox: invalid table name "billing.inbox_messages": must be 1-63 ASCII letters, digits or underscores, not starting with a digit
	// true
}
