// A stub resolver as a Node.js pod uses it: dns.Resolver is c-ares (not
// getaddrinfo), which reads the servers from /etc/resolv.conf, asks over
// UDP and retries over TCP on TC. c-ares's query functions take no search
// list, so the test passes fully qualified names.
//
//   node cares.js gai NAME   -> A and AAAA of NAME
//   node cares.js srv NAME   -> SRV of NAME
// Prints one line per query type: the sorted records, or c-ares's error code.
'use strict';
const dns = require('dns');
const [mode, name] = process.argv.slice(2);
// 5 s and 2 tries, as glibc's defaults, so c-ares outlasts a slow answer.
const resolver = new dns.promises.Resolver({ timeout: 5000, tries: 2 });

async function ask(fn) {
  try {
    const recs = await resolver[fn](name);
    return 'ok ' + recs
      .map((r) => (typeof r === 'string' ? r : `${r.priority} ${r.weight} ${r.port} ${r.name}`))
      .sort()
      .join(' ');
  } catch (e) {
    return 'error ' + e.code;
  }
}

(async () => {
  if (mode === 'srv') {
    console.log('SRV ' + (await ask('resolveSrv')));
  } else {
    console.log('A ' + (await ask('resolve4')));
    console.log('AAAA ' + (await ask('resolve6')));
  }
})();
