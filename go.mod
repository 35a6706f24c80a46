module github.com/sbxdev/sbx

go 1.26

require (
	connectrpc.com/connect v1.19.1
	github.com/sbxdev/sbx/api v0.0.0
)

require google.golang.org/protobuf v1.36.10 // indirect

replace github.com/sbxdev/sbx/api => ./api
