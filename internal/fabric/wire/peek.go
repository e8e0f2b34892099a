package wire

// PeekSender returns the sender's instance ID of a line without decoding
// it (and without allocating), or nil if the line has no sender field
// where its verb puts one. A node uses it to drop its own echoes before
// paying for a full decode; application verbs carry the sender first.
func PeekSender(line []byte) []byte {
	verb, rest, ok := cutField(line)
	if !ok {
		return nil
	}
	skip := 0
	switch string(verb) {
	case VerbRData, VerbPosition:
		skip = 1 // <stream> <writer> ...
	}
	for range skip {
		if _, rest, ok = cutField(rest); !ok {
			return nil
		}
	}
	sender, _, _ := cutField(rest)
	return sender
}
