package wire

// Slab lends the RData values that DecodeIn and DecodeSignedIn decode
// into, from blocks it allocates: decoding the lines of one frame then
// costs an allocation per block rather than one per RDATA, on a reader's
// hot path. The zero value is ready to use; a Slab is not safe for
// concurrent use. A command taken from a Slab keeps its whole block alive.
type Slab struct {
	// Block is the length of the blocks allocated; 0 or less means 16.
	// A reader that knows how many lines it is about to decode says so.
	Block int
	free  []RData
}

func (s *Slab) rdata() *RData {
	if s == nil {
		return new(RData)
	}
	if len(s.free) == 0 {
		n := s.Block
		if n <= 0 {
			n = 16
		}
		s.free = make([]RData, n)
	}
	r := &s.free[0]
	s.free = s.free[1:]
	return r
}

// DecodeIn is Decode, with an RDATA decoded into a value lent by s.
func (c *Codec) DecodeIn(line []byte, s *Slab) (Command, error) { return c.decode(line, false, s) }

// DecodeSignedIn is DecodeSigned, with an RDATA decoded into a value lent
// by s.
func (c *Codec) DecodeSignedIn(line []byte, s *Slab) (Command, error) {
	return c.decode(line, true, s)
}
