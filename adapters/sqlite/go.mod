module github.com/inboxgo/inbox/adapters/sqlite

go 1.25.0

require (
	github.com/inboxgo/inbox v0.0.0
	github.com/mattn/go-sqlite3 v1.14.32
	github.com/segmentio/kafka-go v0.4.51
	gorm.io/driver/sqlite v1.6.0
	gorm.io/gorm v1.31.2
)

require (
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// The library and its adapters are developed together (go.work); a user's
// go.mod names released versions and ignores this line.
replace github.com/inboxgo/inbox => ../..
