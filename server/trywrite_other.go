//go:build !unix

package server

// tryWrite reports that writes cannot be tried without waiting here: the caller writes
// as usual.
func (c *laneConn) tryWrite([]byte) (int, bool, error) { return 0, false, nil }
