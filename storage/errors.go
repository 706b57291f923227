package storage

import (
	"errors"
	"fmt"
	"regexp"
)

// ErrInvalidConfig is wrapped by the configuration errors of the adapters'
// constructors, as by those of inbox.New and outbox.New (inbox.ErrInvalidConfig
// is the same value).
var ErrInvalidConfig = errors.New("inbox: invalid configuration")

var identifierPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ValidateIdentifier reports whether name can be used unquoted as a table or
// schema name in every supported dialect: ASCII letters, digits and
// underscores, not starting with a digit, at most 63 bytes. Adapters call it
// on every configured name before it goes into SQL; its error wraps
// ErrInvalidConfig.
func ValidateIdentifier(kind, name string) error {
	if !identifierPattern.MatchString(name) {
		return &identifierError{kind: kind, name: name}
	}
	return nil
}

type identifierError struct{ kind, name string }

func (e *identifierError) Error() string {
	v := e.name
	if len(v) > 64 {
		v = v[:64] + "..."
	}
	return fmt.Sprintf("inbox: invalid %s %q: must be 1-63 ASCII letters, digits or underscores, not starting with a digit", e.kind, v)
}

func (e *identifierError) Unwrap() error { return ErrInvalidConfig }
