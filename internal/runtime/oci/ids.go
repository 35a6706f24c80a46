package oci

// HostUIDBase is the host uid (and gid) that box uid 0 is stored as: image
// layers, codebases and volumes are stored shifted by it (the canonical
// range, idmap.Canonical) and each box sees them in its own range through
// idmapped mounts.
const HostUIDBase = idMapBase

// IDRange is how many uids and gids each box maps.
const IDRange = idMapSize
