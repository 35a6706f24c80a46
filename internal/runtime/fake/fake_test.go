package fake_test

import (
	"testing"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	agent := testutil.AgentBinary(t)
	testsuite.Run(t, testsuite.Config{
		NewDriver: func(t *testing.T) runtime.Driver {
			d, err := fake.New(fake.Config{StateDir: dir, AgentPath: agent})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		LegacyHandle: testsuite.Unversioned,
		NoIsolation:  true,
	})
}
