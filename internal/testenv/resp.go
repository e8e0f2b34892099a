package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// respTimeout bounds one admin command to a private server, dial included.
const respTimeout = 5 * time.Second

// respError is an error reply ("-ERR ...", "-MOVED ...").
type respError string

func (e respError) Error() string { return "redis: " + string(e) }

// respDo sends one command to addr on a new connection and returns the
// reply: string, int64, nil, respError or []any. Like pingRedis it speaks
// RESP itself: the admin calls of the cluster helpers go to nodes that may
// just have been killed, and a go-redis client's redial goroutines would
// outlive the call.
func respDo(ctx context.Context, addr string, args ...string) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, respTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	reply, err := readReply(bufio.NewReader(conn))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", addr, strings.Join(args, " "), err)
	}
	if e, ok := reply.(respError); ok {
		return nil, fmt.Errorf("%s %s: %w", addr, strings.Join(args, " "), e)
	}
	return reply, nil
}

// respString is respDo for commands that answer with a (bulk) string.
func respString(ctx context.Context, addr string, args ...string) (string, error) {
	reply, err := respDo(ctx, addr, args...)
	if err != nil {
		return "", err
	}
	s, ok := reply.(string)
	if !ok {
		return "", fmt.Errorf("%s %s: reply %#v is not a string", addr, strings.Join(args, " "), reply)
	}
	return s, nil
}

// respInt is respDo for commands that answer with an integer.
func respInt(ctx context.Context, addr string, args ...string) (int64, error) {
	reply, err := respDo(ctx, addr, args...)
	if err != nil {
		return 0, err
	}
	n, ok := reply.(int64)
	if !ok {
		return 0, fmt.Errorf("%s %s: reply %#v is not an integer", addr, strings.Join(args, " "), reply)
	}
	return n, nil
}

// readReply reads one RESP2 reply; an error reply is a respError value,
// not an error, so that one inside an array does not end the read.
func readReply(rd *bufio.Reader) (any, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return respError(body), nil
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err // $-1 is a nil reply
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		items := make([]any, n)
		for i := range items {
			if items[i], err = readReply(rd); err != nil {
				return nil, err
			}
		}
		return items, nil
	default:
		return nil, fmt.Errorf("unexpected reply line %q", line)
	}
}
