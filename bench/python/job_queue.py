"""A job queue through a Redis server: one producer pipelines LPUSH in
batches of 50 while 4 consumers wait in BRPOP (redis-py). Prints how fast
the jobs went in and when all were taken. Used to check that a write which
wakes a waiter, holding its connection's next command until the waiter ran
(as Redis serves it), does not slow a pipelining producer.

    python3 bench/python/job_queue.py PORT
"""
import redis, threading, time, sys
port=int(sys.argv[1]); N=20000; P=50; C=4
done=[0]; lock=threading.Lock()
def consumer():
    r=redis.Redis(port=port)
    while True:
        x=r.brpop("jobs", timeout=2)
        if x is None: return
        if x[1]==b"stop": return
        with lock: done[0]+=1
r=redis.Redis(port=port); r.delete("jobs")
ts=[threading.Thread(target=consumer) for _ in range(C)]
[t.start() for t in ts]
time.sleep(0.3)
t0=time.time()
p=r.pipeline(transaction=False)
for i in range(N):
    p.lpush("jobs", i)
    if (i+1)%P==0: p.execute()
p.execute()
t1=time.time()
while done[0]<N and time.time()-t1<30: time.sleep(0.01)
t2=time.time()
for _ in range(C): r.lpush("jobs","stop")
[t.join() for t in ts]
print(f"port {port}: produced {N} in {t1-t0:.2f}s ({N/(t1-t0):.0f}/s), all consumed after {t2-t0:.2f}s, consumed {done[0]}")
