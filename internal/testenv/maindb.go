package testenv

import (
	"context"
)

// MainDatabase creates an empty database on BaseDatabaseURL's server for
// a TestMain (runnable examples have no *testing.T to clean up after):
// it returns its URL and a drop that removes it, connections and all.
func MainDatabase() (url string, drop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	conn, err := connect(ctx, BaseDatabaseURL())
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(ctx)
	name, err := createDatabase(ctx, conn)
	if err != nil {
		return "", nil, err
	}
	if url, err = withDatabase(BaseDatabaseURL(), name); err != nil {
		return "", nil, err
	}
	return url, func() { _ = dropDatabase(BaseDatabaseURL(), name) }, nil
}
