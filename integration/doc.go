// Package integration holds end-to-end tests that drive the built sbx and
// sbx-agent binaries as a user would: a real daemon, real sandboxes, the CLI
// and the Go SDK. They need root and skip without it.
package integration
