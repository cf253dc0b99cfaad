#!/usr/bin/env python3
"""SQLite under kill -9 of the alignfs daemon.

  sqlite_crash.py run DB MODE    commit transactions until an error; print each committed
                                 transaction's number (flushed) once COMMIT returned
  sqlite_crash.py check DB MODE LAST
                                 integrity_check must say ok, and transactions 1..LAST
                                 must all be present, each complete

MODE is the journal mode (wal or delete); synchronous=FULL always.
"""
import os
import random
import sqlite3
import sys


def connect(db, mode):
    con = sqlite3.connect(db, timeout=5, isolation_level=None)
    con.execute(f"PRAGMA journal_mode={mode}")
    con.execute("PRAGMA synchronous=FULL")
    return con


def run(db, mode):
    # The daemon may die at any point, even before the first transaction.
    try:
        con = connect(db, mode)
        con.execute("CREATE TABLE IF NOT EXISTS txn(n INTEGER PRIMARY KEY, rows INTEGER NOT NULL)")
        con.execute("CREATE TABLE IF NOT EXISTS item(txn INTEGER NOT NULL, k INTEGER NOT NULL, v BLOB NOT NULL)")
        con.execute("CREATE INDEX IF NOT EXISTS item_txn ON item(txn)")
        n = con.execute("SELECT coalesce(max(n), 0) FROM txn").fetchone()[0]
    except (sqlite3.Error, OSError):
        return
    rng = random.Random(os.getpid())
    while True:
        n += 1
        rows = rng.randint(1, 40)
        try:
            con.execute("BEGIN IMMEDIATE")
            for k in range(rows):
                con.execute("INSERT INTO item(txn, k, v) VALUES (?, ?, ?)", (n, k, os.urandom(rng.randint(1, 6000))))
            if rng.random() < 0.2:
                con.execute("DELETE FROM item WHERE txn = ? AND k = 0", (n - 1,))
                con.execute("UPDATE txn SET rows = rows - 1 WHERE n = ? AND rows > 0", (n - 1,))
            con.execute("INSERT INTO txn(n, rows) VALUES (?, ?)", (n, rows))
            con.execute("COMMIT")
        except (sqlite3.Error, OSError):
            return
        print(n, flush=True)


def check(db, mode, last):
    if not os.path.exists(db):
        if last == 0:
            return
        sys.exit(f"database {db} is gone, but {last} transactions were acknowledged")
    con = connect(db, mode)
    result = con.execute("PRAGMA integrity_check").fetchall()
    if result != [("ok",)]:
        sys.exit(f"integrity_check: {result[:5]}")
    if last == 0:
        # Nothing was acknowledged: a kill before the schema's first commit leaves an
        # empty database, or one without every table, and that is correct.
        return
    have = con.execute("SELECT count(*) FROM txn WHERE n <= ?", (last,)).fetchone()[0]
    if have != last:
        sys.exit(f"{last - have} of {last} acknowledged transactions are missing")
    bad = con.execute(
        "SELECT t.n, t.rows, count(i.k) FROM txn t LEFT JOIN item i ON i.txn = t.n "
        "GROUP BY t.n HAVING count(i.k) != t.rows LIMIT 3").fetchall()
    if bad:
        sys.exit(f"transactions with missing or extra rows (n, expected, found): {bad}")


if __name__ == "__main__":
    command, db, mode = sys.argv[1:4]
    if command == "run":
        run(db, mode)
    else:
        check(db, mode, int(sys.argv[4]))
