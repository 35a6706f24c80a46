module github.com/sbxdev/sbx/sdk/go

go 1.26

require (
	connectrpc.com/connect v1.19.1
	github.com/google/go-cmp v0.7.0
	github.com/sbxdev/sbx/api v0.1.0
)

require google.golang.org/protobuf v1.36.10 // indirect

// In this repository the SDK builds against the api/ beside it; a module
// that requires the SDK gets api v0.1.0 (tag api/v0.1.0) instead, since
// replace directives apply only in the main module.
replace github.com/sbxdev/sbx/api => ../../api
