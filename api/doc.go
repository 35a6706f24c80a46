// Package api holds sbx's protobuf schema (proto/), the Go code generated
// from it (gen/) and the framed exec wire format (execframe/) that carries
// the Exec RPC's messages where HTTP/2 costs too much. It is its own module
// and imports nothing else from sbx. Regenerate gen/ with
// scripts/gen-proto.sh; CI fails if that produces a diff.
package api
