module github.com/inboxgo/inbox

go 1.25.0

require (
	github.com/mattn/go-sqlite3 v1.14.32
	github.com/segmentio/kafka-go v0.4.51
	gorm.io/driver/sqlite v1.6.0
	gorm.io/gorm v1.31.2
)

require (
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.15.9 // indirect
	github.com/pierrec/lz4/v4 v4.1.15 // indirect
	golang.org/x/text v0.23.0 // indirect
)
