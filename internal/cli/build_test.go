package cli

import "testing"

func TestIsDockerfile(t *testing.T) {
	for file, want := range map[string]bool{
		"Dockerfile": true, "app.Dockerfile": true, "Dockerfile.dev": true, "ctx/Containerfile": true,
		"recipe.yaml": false, "python.YML": false, "r.json": false,
	} {
		if got := isDockerfile(file); got != want {
			t.Errorf("isDockerfile(%q) = %v, want %v", file, got, want)
		}
	}
}
