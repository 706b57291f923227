module github.com/inboxgo/inbox/transport/franzgo

go 1.25.0

// franz-go v1.21.7 is the newest release whose go directive the library's
// floor (go 1.25) allows: v1.22 says go 1.26. A module that requires a newer
// franz-go gets it (the dev module, for kfake, does).
require (
	github.com/inboxgo/inbox v0.0.0
	github.com/segmentio/kafka-go v0.4.51
	github.com/twmb/franz-go v1.21.7
	github.com/twmb/franz-go/pkg/kmsg v1.13.1
)

require (
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/pierrec/lz4/v4 v4.1.26 // indirect
	golang.org/x/text v0.23.0 // indirect
	gorm.io/gorm v1.31.2 // indirect
)

// The library and its modules are developed together (go.work); a user's
// go.mod names released versions and ignores this line.
replace github.com/inboxgo/inbox => ../..
