// Package adapterkit holds what the adapters of this module share and a
// third-party adapter may use: a transaction opened on a connection without
// database/sql's BeginTx ([Tx], for a storage.ClaimBeginner that sends BEGIN
// with its claim), the global order of a claim's row locks ([SortRows]), and
// the table of stored offsets on GORM ([OffsetTable], for a
// storage.OffsetStore). Application code does not need it.
package adapterkit
