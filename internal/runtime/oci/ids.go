package oci

// HostUIDBase is the host uid (and gid) that uid 0 of every box maps to;
// image layers are stored shifted by it so that box root owns image root's files.
const HostUIDBase = idMapBase

// IDRange is how many uids and gids each box maps.
const IDRange = 65536
