// Package api holds sbx's protobuf schema (proto/) and the Go code generated
// from it (gen/). It is its own module and imports nothing else from sbx.
// Regenerate with scripts/gen-proto.sh; CI fails if that produces a diff.
package api
