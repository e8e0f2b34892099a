package weft

// Validate is validate for the tests of package weft_test: what Open
// refuses a Config for, without opening anything.
func (c Config) Validate() error { return c.validate() }
